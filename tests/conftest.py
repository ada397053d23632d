import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("COURSE_SCALE", "ci")
