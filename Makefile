# The training-ledger course kit. Two commands: `make course` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: course site test lab notebooks benchmarks assignments clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

## make course: execute every notebook at its teaching scale into build/ and print headline figures
## (NB="00 03": only those; JOBS=1: one lesson at a time, default two at once on a CPU machine;
## NB=--plan: run nothing, print each lesson's times and its gpu time predicted on a T4)
course: $(STAMP)
	$(PY) tools/run_course.py --scale $${COURSE_SCALE:-default} $(if $(JOBS),--jobs $(JOBS)) $(NB)

## make site: build/index.html and a page per lesson from the lessons `make course` executed into
## build/ (make course rebuilds it as each lesson finishes; open build/index.html in a browser)
site: $(STAMP)
	$(PY) tools/course_site.py

## make test: unit tests + every notebook end to end under nbval at CI scale (-rs: say what was
## skipped and why, e.g. the browser test without Chromium)
## (PYTHONPATH=tools/kernel_site: no process of the suite builds rfc3987_syntax's grammar, see there)
test: $(STAMP)
	PYTHONPATH=$(CURDIR)/tools/kernel_site$${PYTHONPATH:+:$$PYTHONPATH} COURSE_SCALE=ci COURSE_CHECK_PLACEMENT=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -q -rs --nbval-lax --nbval-current-env -p no:cacheprovider --ignore=notebooks/student -n 2 --dist loadfile --no-loadscope-reorder tests notebooks

## make lab: JupyterLab on your own copies of the student editions, in my-work/ (made once, never
## overwritten: git pull stays clean; `python tools/lab.py --refresh 02` takes one lesson afresh)
lab: $(STAMP)
	$(PY) tools/lab.py
	$(VENV)/bin/jupyter lab my-work/

## make notebooks: regenerate notebooks/*.ipynb, the student editions and their checks from notebooks/src/
notebooks: $(STAMP)
	$(PY) tools/notebooks.py build

## make benchmarks: run benchmarks/ and write benchmarks/results/*.json
benchmarks: $(STAMP)
	$(PY) -m pip install -e ".[dev,bench]"
	$(PY) benchmarks/run.py

## make assignments: student notebooks + autograder zips for every lesson with exercises, into dist/
assignments: $(STAMP)
	$(PY) tools/assign.py

clean:
	rm -rf build dist .pytest_cache
