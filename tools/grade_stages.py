"""The sandboxed processes of grading one submission, each started by tools/grade.py in a sandbox
of its own (tools/sandbox.py). Only plain data (tools/plain.py) passes between them.

    python grade_stages.py execute SUBMISSION.ipynb NAMES_JSON OUT_FD
        Stage 1 (untrusted). Executes the student's notebook in a Jupyter kernel (errors do not
        stop it), then exports from the kernel the answers named in NAMES_JSON; writes
        ``{"answers": ..., "executed": <notebook text>}`` to OUT_FD (see :func:`export_answers`),
        or ``{"cpu_limit": N}`` when the kernel was killed at its N CPU-second limit.

    python grade_stages.py serve BUNDLE.json NAME IN_FD OUT_FD
        A function answer (untrusted), one process per question, in a sandbox without the kit:
        defines the student's function ``NAME`` from its source and the helpers it uses, then
        answers calls: reads ``{"args", "kwargs"}`` (plain data) from IN_FD, writes
        ``{"ok": <plain result>}`` or ``{"error": "..."}`` to OUT_FD. See :func:`serve`.

    python grade_stages.py scorer LESSON.ipynb TESTS_DIR SOCKET_FD
        Stage 2 (trusted: no student code runs here), one process per grading worker, reused
        across submissions (see :func:`scorer`). For each job it forks a child that runs the
        instructor's student edition of the lesson, binds the student's *value* answers (plain
        data, rebuilt by tools/plain.py) where the answer cells are, binds each *function* answer
        as a :class:`FunctionAnswer` that sends its arguments to that question's ``serve``
        process and decodes what comes back, runs otter's test files and writes
        ``{"tests": [{name, score, max_score, output}]}`` to the job's result pipe.

answers (stage 1's claim, checked by tools/grade.py against the declared answer kinds)::

    {"values":    {name: <plain data>},
     "functions": {name: {"source": "def f(x): ...",
                          "helpers": {hname: {"source": ...} | {"module": "math"} |
                                             {"value": <plain>} | {"unavailable": "why"}}}},
     "refused":   {name: "why it could not be exported"}}
"""
from __future__ import annotations

import ast
import json
import os
import select
import shutil
import socket
import struct
import sys
import textwrap
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain  # noqa: E402

# jsonschema (under nbformat and otter) imports rfc3987_syntax when it is installed, only to check
# the "iri" string format, which no notebook schema uses; building its grammar costs ~2 s of CPU
# in every stage of every submission. Marked missing, jsonschema skips that one format.
sys.modules.setdefault("rfc3987_syntax", None)

MAX_EXECUTED_BYTES = 64 * 2**20
MAX_MESSAGE_BYTES = 64 * 2**20       # one call's arguments or result
MAX_FUNCTION_ANSWERS = 64            # function answers of one lesson (descriptors in a job)
CALL_SECONDS = 120.0                 # one call of a student's function
SKIP_MARKERS = ("grader.check(", "otter.Notebook(")  # otter's own cells in the student edition
KIT = "course_utils"


# --------------------------------------------------------------------------- framing

def frame(obj) -> bytes:
    """One message: 8-byte length, then JSON (no NaN literals: plain data spells them)."""
    body = json.dumps(obj, allow_nan=False).encode("utf-8", "backslashreplace")
    return struct.pack(">Q", len(body)) + body


def send(fd: int, obj) -> None:
    """Write one :func:`frame` of ``obj`` to ``fd``."""
    data = frame(obj)
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int, deadline: float, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """One message's JSON bytes; raises TimeoutError, EOFError or ValueError (too large)."""
    head = _read_exactly(fd, 8, deadline)
    (size,) = struct.unpack(">Q", head)
    if size > limit:
        raise ValueError(f"a message of {size} bytes (limit {limit})")
    return _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


# --------------------------------------------------------------------------- stage 1 (untrusted)

def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _function_source(fn) -> str:
    import inspect
    return textwrap.dedent(inspect.getsource(fn))


def _helper(value) -> dict:
    """How the function sandbox gets one global a student's function uses."""
    if isinstance(value, types.ModuleType):
        if value.__name__.split(".")[0] == KIT:
            return {"unavailable": f"the kit's module {value.__name__}"}
        return {"module": value.__name__}
    if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
        return {"source": _function_source(value)}
    if getattr(value, "__module__", "").split(".")[0] == KIT:
        return {"unavailable": f"the kit's {value.__module__}.{getattr(value, '__qualname__', '')}"}
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        name = getattr(value, "__qualname__", None)
        if module and name and "<" not in name:
            return {"import": [module, name]}
    return {"value": plain.encode(value)}


def export_answers(namespace: dict, names: list[str], path: str) -> None:
    """Write the answers ``names`` from the kernel's ``namespace`` to ``path`` (the format in the
    module docstring). Runs in the student's kernel: its output is only the student's claim."""
    Path(path).write_text(json.dumps(claim_of(namespace, names), allow_nan=False))


def claim_of(namespace: dict, names: list[str]) -> dict:
    """The answers ``names`` in ``namespace`` as plain data (the format in the module docstring)."""
    out = {"values": {}, "functions": {}, "refused": {}}
    for name in names:
        if name not in namespace:
            continue
        value = namespace[name]
        try:
            if isinstance(value, types.FunctionType):
                out["functions"][name] = _bundle(namespace, value)
            else:
                out["values"][name] = plain.encode(value)
        except Exception as err:  # anything not plain data: say why, carry nothing
            out["refused"][name] = f"{type(err).__name__}: {err}"[:500]
    return out


def _bundle(namespace: dict, fn) -> dict:
    helpers, todo = {}, sorted(_code_names(fn.__code__))
    while todo:
        name = todo.pop()
        if name in helpers or name not in namespace or name.startswith("__"):
            continue
        value = namespace[name]
        try:
            helpers[name] = _helper(value)
        except Exception as err:
            helpers[name] = {"unavailable": f"a {type(value).__name__} ({err})"[:300]}
        if isinstance(value, types.FunctionType) and "source" in helpers[name]:
            todo += sorted(_code_names(value.__code__))
    return {"source": _function_source(fn), "helpers": helpers}


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl(option, value); False where there is none (not Linux: the sandbox is not
    available there either)."""
    import ctypes
    try:
        ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return True


def _not_dumpable() -> None:
    """The kernel this process starts runs as the same uid: without this it could take the
    channel to the grader out of this process (``pidfd_getfd``, ptrace)."""
    _prctl(4, 0)  # PR_SET_DUMPABLE, 0


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent (PID ``parent``, read before the fork) dies
    (``PR_SET_PDEATHSIG``)."""
    import signal
    if _prctl(1, signal.SIGKILL) and os.getppid() != parent:  # it died before the call
        os._exit(1)


def execute(submission: str, names_json: str, out_fd: str, assignment: str = "") -> None:
    import nbformat
    from jupyter_client.connect import ConnectionFileMixin
    from nbclient import NotebookClient

    out = int(out_fd)
    os.set_inheritable(out, False)  # the student's kernel never holds the channel to the grader
    _not_dumpable()
    # unix sockets, not TCP ports: with TCP we saw grading hang now and then on a busy machine
    # where other kernels start at the same time (port races)
    ConnectionFileMixin.class_traits()["transport"].default_value = "ipc"
    # parsed here, in the sandbox, not in the grader: JSON can take 20x its size in memory
    nb = nbformat.read(submission, as_version=4)
    got = nb.metadata.get("otter", {}).get("assignment_name") if isinstance(
        nb.metadata.get("otter"), dict) else None
    if assignment and got != assignment:
        send(out, {"refused": f"a notebook of assignment {str(got)[:80]!r}, not of "
                              f"{assignment!r}: was it handed in for another lesson?"})
        return
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    from kernel_client import CLIENT_OPTIONS  # no cell limit here: see kernel_client
    # the kernel is killed, not asked to exit, once the exporter cell has written the answers: a
    # graceful exit (torch's teardown) cost about 2 s and 1.5 CPU-s a submission, and whatever
    # the kernel started dies with the sandbox's PID namespace either way
    client = NotebookClient(nb, timeout=None, allow_errors=True, kernel_name="python3",
                            **CLIENT_OPTIONS, shutdown_kernel="immediate",
                            resources={"metadata": {"path": os.getcwd()}})
    exporter = nbformat.v4.new_code_cell(
        f"import sys as _gs; _gs.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import grade_stages as _gs\n"
        f"_gs.export_answers(globals(), {json.loads(names_json)!r}, 'answers.json')")
    from nbclient.exceptions import DeadKernelError
    with client.setup_kernel():
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            executed = nbformat.writes(nb)
            nb.cells.append(exporter)
            client.execute_cell(exporter, len(nb.cells) - 1)
        except DeadKernelError:
            seconds = _cpu_limit_reached(client.km.provisioner)
            if seconds is None:
                raise
            send(out, {"cpu_limit": seconds})
            return
    answers = _read_own_file("answers.json", MAX_MESSAGE_BYTES)
    send(out, {"answers": answers, "executed": executed[:MAX_EXECUTED_BYTES]})


def _cpu_limit_reached(provisioner) -> int | None:
    """The CPU-second limit (RLIMIT_CPU, set by the sandbox and inherited by the kernel) if the
    dead kernel was stopped by it, else None. The kernel used up its allowance when it died of
    SIGXCPU, or of SIGKILL (the hard limit: a kernel that ignores SIGXCPU) with at least the
    limit's CPU seconds spent by the children this process has reaped (the kernel is its only
    one); a kernel killed for any other reason (memory, a crash) is not a time limit."""
    import resource
    import signal
    process = getattr(provisioner, "process", None)
    limit = resource.getrlimit(resource.RLIMIT_CPU)[0]
    if process is None or limit == resource.RLIM_INFINITY:
        return None
    try:
        code = process.wait(timeout=10)
    except Exception:  # noqa: BLE001 - still running or already gone: not ours to judge
        return None
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and used.ru_utime + used.ru_stime >= limit - 1):
        return int(limit)
    return None


def _read_own_file(name: str, limit: int) -> str | None:
    """A file the kernel wrote in this folder, not following a link it may have planted."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    return data.decode("utf-8", "replace") if len(data) <= limit else None


# --------------------------------------------------------------------------- function sandboxes

def _block_kit() -> None:
    """Make the kit unimportable in this process. Inside bubblewrap its folder is also hidden
    (tools/sandbox.py ``hidden``), so this only matters for an unisolated run."""
    for name in list(sys.modules):
        if name.split(".")[0] == KIT:
            del sys.modules[name]
    sys.modules[KIT] = None  # `import course_utils` now raises ImportError


def _unavailable(name: str, why: str):
    def stub(*args, **kwargs):
        raise NameError(f"`{name}` ({why}) is not available when a function answer is graded: "
                        "it runs with Python, math, torch and numpy only")
    return stub


def define(bundle: dict, name: str) -> dict:
    """The namespace in which the student's function ``name`` and its helpers are defined."""
    import importlib
    ns: dict = {"__name__": "__answer__"}
    sources = []
    for hname, entry in bundle.get("helpers", {}).items():
        kind = next(iter(entry), None)
        try:
            if kind == "module" and entry["module"].split(".")[0] != KIT:
                ns[hname] = importlib.import_module(entry["module"])
            elif kind == "import" and entry["import"][0].split(".")[0] != KIT:
                obj = importlib.import_module(entry["import"][0])
                for part in entry["import"][1].split("."):
                    obj = getattr(obj, part)
                ns[hname] = obj
            elif kind == "value":
                ns[hname] = plain.decode(entry["value"])
            elif kind == "source":
                sources.append(entry["source"])
            else:
                ns[hname] = _unavailable(hname, entry.get("unavailable", "unknown"))
        except Exception as err:
            ns[hname] = _unavailable(hname, f"{type(err).__name__}: {err}")
    for source in sources + [bundle["source"]]:
        exec(compile(source, "<your notebook>", "exec"), ns)
    return ns


def serve(bundle_path: str, name: str, in_fd: str, out_fd: str) -> None:
    """Answer calls of the student's function ``name`` until the caller closes the channel."""
    rfd, wfd = int(in_fd), int(out_fd)
    _block_kit()
    fn = _answer_function(json.loads(Path(bundle_path).read_text()), name)
    while True:
        try:
            request = json.loads(receive(rfd, time.monotonic() + 86400))
        except EOFError:
            return
        send(wfd, _reply(fn, request))


def _answer_function(bundle: dict, name: str):
    """The student's function ``name`` defined from its bundle, or a stub that says why not."""
    try:
        return define(bundle, name)[name]
    except Exception as err:
        return _unavailable(name, f"your definition failed: {type(err).__name__}: {err}")


def _reply(fn, request: dict) -> dict:
    """``fn`` called with one request's plain arguments: its plain result, or the error it raised."""
    try:
        args = plain.decode(request["args"])
        kwargs = plain.decode(request["kwargs"])
        return {"ok": plain.encode(fn(*args, **kwargs))}
    except BaseException as err:  # the student's code failed: report it as the answer
        return {"error": f"{type(err).__name__}: {err}"[:2000], "type": type(err).__name__}


# --------------------------------------------------------------------------- stage 2 (trusted)

class AnswerError(BaseException):
    """A function answer returned something that is not plain data, did not reply, or raised an
    exception that is not one of :data:`RERAISED`. A BaseException, so that
    ``check_raises(Exception, ...)`` cannot pass a function that hangs or replies garbage."""


# exceptions a student's function may raise on purpose (a check_raises test): raised again here,
# by name, as the built-in class (never a class of the submission's making)
RERAISED = {e.__name__: e for e in (ValueError, TypeError, ZeroDivisionError, IndexError,
                                    KeyError, ArithmeticError, OverflowError, AssertionError,
                                    NotImplementedError, RuntimeError, LookupError)}


class FunctionAnswer:
    """Stands for the student's function ``name`` in the trusted stage: a call sends the
    arguments (plain data) to the function's own sandbox and returns what comes back, rebuilt
    from plain data. The student's code never runs in this process."""

    def __init__(self, name: str, to_fd: int, from_fd: int):
        self.name, self._to, self._from = name, to_fd, from_fd
        self.__name__ = self.__qualname__ = name

    def _exchange(self, request: dict):
        """Send one call's plain arguments to the function's sandbox; its reply, parsed."""
        send(self._to, request)
        return json.loads(receive(self._from, time.monotonic() + CALL_SECONDS))

    def __call__(self, *args, **kwargs):
        try:
            reply = self._exchange({"args": plain.encode(list(args)), "kwargs": plain.encode(kwargs)})
        except plain.NotPlainData as err:
            raise TypeError(f"the test passed {self.name} something that is not plain data: "
                            f"{err}") from None
        except (TimeoutError, EOFError, OSError, ValueError) as err:
            raise AnswerError(f"your function `{self.name}` did not answer "
                              f"({type(err).__name__}: it crashed, hung for more than "
                              f"{CALL_SECONDS:g} s or replied too much)") from None
        if type(reply) is not dict or not ({"ok"} == set(reply) or
                                           {"error", "type"} == set(reply)):
            raise AnswerError(f"your function `{self.name}` gave a malformed reply")
        if "error" in reply:
            text = plain.printable_text(str(reply["error"])[:2000])
            kind = RERAISED.get(reply["type"]) if isinstance(reply["type"], str) else None
            if kind is not None:
                raise kind(f"(raised by your function `{self.name}`) {text}")
            raise AnswerError(f"your function `{self.name}` raised {text}")
        try:
            return plain.decode(reply.get("ok"))
        except plain.NotPlainData as err:
            raise AnswerError(f"your function `{self.name}` returned something that is not "
                              f"plain data: {err}") from None

    def __repr__(self) -> str:
        return f"<your function {self.name}>"


def declared_answers(source: str) -> dict[str, str]:
    """name -> "function" (a ``def`` in the answer cell) or "value" (anything assigned), for
    one answer cell of the instructor's student edition: the kind each answer must have."""
    kinds: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kinds[node.name] = "function"
        elif isinstance(node, ast.ClassDef):
            kinds[node.name] = "value"
        for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            if target is not None:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        kinds.setdefault(n.id, "value")
    return kinds


class InProcessAnswer(FunctionAnswer):
    """A :class:`FunctionAnswer` whose function runs in this process, defined from its bundle as
    the function's sandbox defines it, with the same plain data both ways and the same errors.
    For the kit's own tests only (notebooks/conftest.py): it runs the code it is given."""

    def __init__(self, name: str, bundle: dict):
        super().__init__(name, -1, -1)
        self._fn = _answer_function(json.loads(json.dumps(bundle)), name)

    def _exchange(self, request: dict):
        request = json.loads(json.dumps(request, allow_nan=False))
        return json.loads(json.dumps(_reply(self._fn, request), allow_nan=False))


# the largest function answer (its source and helpers, as JSON) the grader accepts
MAX_SOURCE_CHARS = 200_000


def check_answers(claim, declared: dict[str, str]) -> tuple[dict, dict, list[str]]:
    """Stage 1's claim, held to the declared kinds. Returns (value answers as validated plain
    data, function answers' bundles, notes for the feedback). Nothing here runs the claim."""
    if not isinstance(claim, dict):
        claim = {}
    got_values, got_functions, refused = (claim.get(k) if isinstance(claim.get(k), dict) else {}
                                          for k in ("values", "functions", "refused"))
    values, functions, notes = {}, {}, []
    for name, kind in declared.items():
        if name in got_values:
            if kind == "function":
                notes.append(f"answer `{name}` not used: it should be a function "
                             f"(`def {name}(...)`), not a value")
                continue
            try:
                value = plain.decode(got_values[name], build_tensors=False)
            except plain.NotPlainData as err:
                notes.append(f"answer `{name}` not used: {err}")
                continue
            values[name] = plain.reencode(value)
        elif name in got_functions:
            bundle = got_functions[name]
            if kind == "value":
                notes.append(f"answer `{name}` not used: it should be a value (a number, string, "
                             "list, dict or tensor); a function given for a value is not run")
            elif not (isinstance(bundle, dict) and isinstance(bundle.get("source"), str)
                      and isinstance(bundle.get("helpers", {}), dict)
                      and len(json.dumps(bundle)) <= MAX_SOURCE_CHARS):
                notes.append(f"answer `{name}` not used: its source could not be read")
            else:
                functions[name] = bundle
        elif name in refused:
            notes.append(f"answer `{name}` not used: it is not plain data "
                         f"({str(refused[name])[:300]}); give a number, string, list, dict, "
                         "tensor or function")
        else:
            notes.append(f"answer `{name}` is not defined in the submission")
    return values, functions, notes


def as_graded(namespace: dict, answer_cells: list[str]) -> list[str]:
    """Rebind the answers that ``answer_cells`` (their sources) declare in ``namespace`` as
    grading binds them: the claim stage 1 would send, held to the declared kinds by the grader's
    ``check_answers`` (above), values rebuilt from plain data, each function an
    :class:`InProcessAnswer`; an answer grading would not use is removed. Returns grading's notes.
    notebooks/conftest.py calls it in each lesson's kernel before a question's tests, so nbval runs
    every lesson's tests against its reference as grading would, without a sandbox. Not checked
    here: that a function answer imports nothing of the kit at call time (its sandbox has none)."""
    declared = {n: kind for source in answer_cells for n, kind in declared_answers(source).items()}
    claim = json.loads(json.dumps(claim_of(namespace, list(declared)), allow_nan=False))
    values, functions, notes = check_answers(claim, declared)
    for name in declared:
        namespace.pop(name, None)
    for name, encoded in values.items():
        namespace[name] = plain.decode(encoded)
    for name, bundle in functions.items():
        namespace[name] = InProcessAnswer(name, bundle)
    return notes


def run_lesson(lesson: str, values: dict, functions: dict[str, FunctionAnswer],
               notes: list[str]) -> dict:
    """Execute the trusted cells of the student edition in this interpreter, binding the
    student's answers in place of each answer cell; return the namespace."""
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    ns = shell.user_ns
    for cell in nbformat.read(lesson, as_version=4).cells:
        if cell.cell_type != "code" or any(m in cell.source for m in SKIP_MARKERS):
            continue
        if "otter_answer_cell" not in cell.metadata.get("tags", []):
            shell.run_cell(cell.source, store_history=False)
            continue
        for name in declared_answers(cell.source):
            ns.pop(name, None)
            if name in functions:
                ns[name] = functions[name]
            elif name in values:
                try:
                    ns[name] = plain.decode(values[name])
                except plain.NotPlainData as err:
                    notes.append(f"answer `{name}` not used: {err}")
    return ns


def score(lesson: str, answers: dict, tests_dir: str, result_fd: int,
          channels: dict[str, tuple[int, int]]) -> None:
    """Score one submission's ``answers`` (values and notes, as tools/grade.py checked them) in
    this process; write the results to ``result_fd``. ``channels``: function answer name ->
    (calls fd, replies fd) of its ``serve`` sandbox."""
    os.set_inheritable(result_fd, False)
    notes = list(answers.get("notes", []))
    functions = {name: FunctionAnswer(name, *fds) for name, fds in channels.items()}
    from otter.test_files import GradingResults, OKTestFile

    ns = run_lesson(lesson, answers.get("values", {}), functions, notes)
    test_files = []
    for path in sorted(Path(tests_dir).glob("*.py")):
        tf = OKTestFile.from_file(str(path))
        tf.run(dict(ns))
        test_files.append(tf)
    results = GradingResults(test_files)
    prefix = "".join(f"note: {n}\n" for n in notes)
    tests = [{"name": "Public Tests", "output": prefix + results.summary(public_only=True)}]
    tests += [{"name": tf.name, "score": tf.score, "max_score": tf.possible,
               "output": prefix + tf.summary()} for tf in test_files]
    send(result_fd, {"tests": tests})
    os.close(result_fd)


# imported once by the scorer before it forks: every scoring child needs them, and a fresh
# process paid ~3.5 s of CPU for them per submission (torch ~1.7 s, otter ~0.7 s). torch._dynamo
# too: the first optimizer a lesson builds imports it (torch wraps Optimizer.add_param_group in
# torch._disable_dynamo), ~1-1.5 s more
WARM_MODULES = ("nbformat", "otter.test_files", "IPython.core.interactiveshell", "torch",
                "torch._dynamo", "course_utils.exercises", "matplotlib.pyplot")


def scorer(lesson: str, tests_dir: str, socket_fd: str, graders_pid_namespace: str) -> None:
    """Stage 2's process: import :data:`WARM_MODULES` once, then score one job at a time, each in
    a child forked from this process, until the grader closes the socket.

    Why a fork server and not a process per submission: the imports above were most of stage 2's
    cost on a small lesson. Why it is safe: only trusted code runs here and in the children (the
    instructor's lesson and tests); a submission reaches them as a job message of plain data and
    as pipes to its function answers' sandboxes, never as files. Each child starts from this
    process as it was before any job, in a session of its own, with its own working folder, HOME
    and TMPDIR. After it ends, what it left is removed (:func:`_end_job`); in a sandbox of its own
    (a PID namespace other than ``graders_pid_namespace``, the grader's) that is every other
    process of the namespace and everything in ``/tmp`` and ``/dev/shm`` but bwrap's mount
    points; without one, only the child's session and folder. If that fails, the reply says
    ``retiring`` and this process ends: the grader starts a fresh one.

    A job is one byte carrying descriptors (``socket.send_fds``: result pipe, output pipe, then
    each function answer's calls and replies pipes, in the order of ``channels``), then one
    framed JSON message ``{"student", "answers", "channels"}``. It is answered twice:
    ``{"started": <the child's PID>}`` at once, and ``{"returncode": <exit status>,
    "retiring": <bool>}`` once the child has ended and its leftovers are gone."""
    import importlib
    import tempfile
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a kit without torch (or the kit hidden): the child imports it
            pass
    own_namespace = os.stat("/proc/self/ns/pid").st_ino != int(graders_pid_namespace)
    sock = socket.socket(fileno=int(socket_fd))
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1, 4 + 2 * MAX_FUNCTION_ANSWERS)
        if not message:
            return  # the grader is done
        try:
            job = json.loads(receive(sock.fileno(), time.monotonic() + 60))
            folder = Path(tempfile.mkdtemp(prefix="job", dir=Path.cwd()))
            for sub in ("home", "tmp"):
                (folder / sub).mkdir()
            sys.stdout.flush()
            sys.stderr.flush()
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                sock.close()
                _score_job(job, fds, folder, lesson, tests_dir, me)  # never returns
        finally:
            for fd in fds:
                os.close(fd)
        send(sock.fileno(), {"started": pid})
        # WNOWAIT: the exited child keeps its PID (so its session's ID) until its session is killed
        status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        try:
            left = _end_job(pid, folder, own_namespace)
        except Exception as err:
            left = [f"cleaning up failed: {type(err).__name__}: {err}"]
        os.waitpid(pid, 0)
        code = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
        send(sock.fileno(), {"returncode": code, "retiring": bool(left)})
        if left:
            print(f"scorer: retiring, a job left {left}", flush=True)
            return


def _end_job(pid: int, folder: Path, own_namespace: bool) -> list:
    """Kill what the job ``pid`` (exited, not yet reaped) left running and remove what it left on
    disk; returns what could not be (empty when all is gone)."""
    import signal
    try:
        os.killpg(pid, signal.SIGKILL)  # the child's session (it called setsid)
    except (ProcessLookupError, PermissionError):
        pass
    # a process that left the session: in a namespace of its own, every process but grading's
    left: list = _kill_the_rest_of_the_namespace(pid) if own_namespace else []
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        left.append(folder)
    if own_namespace:  # this sandbox's private tmpfs, not the machine's
        mounts = {_mount_point(line) for line in
                  Path("/proc/self/mounts").read_text(errors="surrogateescape").splitlines()}
        for shared in (Path("/tmp"), Path("/dev/shm")):
            left += _empty(shared, mounts)
    return left


def _kill_the_rest_of_the_namespace(child: int) -> list:
    """SIGKILL every process of this PID namespace but this one, its ancestors (bwrap's) and the
    exited ``child``, until none is left (a process may fork while a pass kills); what survived
    twenty passes."""
    import signal
    keep = {os.getpid(), child}
    ancestor = os.getpid()
    while ancestor > 1:
        ancestor = int(Path(f"/proc/{ancestor}/stat").read_text().rsplit(")", 1)[1].split()[1])
        keep.add(ancestor)
    for _ in range(20):
        others = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in keep]
        if not others:
            return []
        for other in others:
            try:
                os.kill(other, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.waitpid(other, os.WNOHANG)  # the ones that were this process's
            except ChildProcessError:
                pass
        time.sleep(0.01)
    return [f"processes {others}"]


def _mount_point(line: str) -> Path:
    """The mount point of one line of /proc/self/mounts (octal escapes such as \\040 decoded)."""
    import re
    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]),
                 line.split()[1].encode(errors="surrogateescape"))
    return Path(os.fsdecode(raw))


def _empty(folder: Path, mounts: set[Path]) -> list[Path]:
    """Remove everything under ``folder`` but the mount points in ``mounts`` and the folders
    that lead to them (bwrap made those to hold bound paths); what could not be removed."""
    left = []
    for entry in folder.iterdir():
        if entry in mounts:
            continue
        if any(m.is_relative_to(entry) for m in mounts) and not entry.is_symlink():
            left += _empty(entry, mounts)
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            left.append(entry)
    return left


def _score_job(job: dict, fds: list[int], folder: Path, lesson: str, tests_dir: str,
               parent: int) -> None:
    """The forked child of :func:`scorer` (PID ``parent``): one job, then ``os._exit``."""
    code = 1
    try:
        os.setsid()  # its session: the scorer kills whatever it leaves
        _die_with_parent(parent)  # a scorer killed for time takes its job with it
        _not_dumpable()  # nothing else of this uid can read its memory or take its pipes
        result_fd, output_fd, *pipes = fds
        for fd in pipes:  # a process the lesson starts inherits none of them
            os.set_inheritable(fd, False)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.environ.update(COURSE_STUDENT_ID=job["student"], HOME=str(folder / "home"),
                          TMPDIR=str(folder / "tmp"))
        import tempfile
        tempfile.tempdir = None  # the next call reads TMPDIR again
        os.chdir(folder)
        channels = {name: (pipes[2 * i], pipes[2 * i + 1])
                    for i, name in enumerate(job["channels"])}
        score(lesson, job["answers"], tests_dir, result_fd, channels)
        code = 0
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    stage, *args = sys.argv[1:]
    {"execute": execute, "serve": serve, "scorer": scorer}[stage](*args)
