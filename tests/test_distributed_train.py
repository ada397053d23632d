"""The training script (course_utils.distributed.train) under real torchrun: a rank killed and the
group restarted, two agents as two nodes, and in-process single-rank resumes.

The torchrun runs start processes (each imports torch: seconds on a small CPU), so the runs that
compare against one reference start together and the reference is shared.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import background

from course_utils.distributed import train as script
from course_utils.distributed.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--steps", "30", "--batch", "16", "--hidden", "32"]   # 89 batches/epoch: no epoch end
EPOCH_ARGS = ["--steps", "14", "--batch", "256", "--hidden", "16"]  # 5 batches/epoch: 2 epoch ends
EXACT = [*ARGS, "--dtype", "float64", "--noise", "0", "--dropout", "0"]  # nothing random, fp64
TIMEOUT = 150


def torchrun(*torchrun_args, script_args=()):
    """Start ``python -m torch.distributed.run ... -m course_utils.distributed.train``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_args,
           "-m", "course_utils.distributed.train", *script_args]
    return background.popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc) -> str:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT} s:\n{out}\n{err[-3000:]}")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{out}\n{err[-3000:]}"
    return out


def last_hash(out: str) -> str:
    lines = out.strip().splitlines()
    assert lines and lines[-1].startswith(script.HASH_PREFIX), f"last line is not the hash:\n{out}"
    return lines[-1][len(script.HASH_PREFIX):]


def start_in_background(tmp: Path):
    """The torchrun runs, in the background (tests/background.py): an uninterrupted 2-rank run
    and, at the same time, one whose rank 1 is killed before step 25 (checkpoints every 10 steps,
    one restart allowed); then two agents as two nodes."""
    def run_all() -> dict:
        ckpt = tmp / "ckpt"
        straight = torchrun("--standalone", "--nproc_per_node", "2", script_args=ARGS)
        crashed = torchrun("--standalone", "--nproc_per_node", "2", "--max-restarts", "1",
                           script_args=[*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-every",
                                        "10", "--crash-at-step", "25", "--crash-rank", "1"])
        done = {"straight": finish(straight), "crashed": finish(crashed), "ckpt": ckpt}
        port = free_port()
        agents = [torchrun("--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "two-nodes",
                           script_args=ARGS) for _ in range(2)]
        done["agents"] = [finish(a) for a in agents]
        # fp64, nothing random: 2-rank runs preempted after step 10 (DDP and FSDP2) whose
        # checkpoints a 1-rank run resumes (test below)
        ranks2 = ("--standalone", "--nproc_per_node", "2")
        stopped = {strategy: torchrun(*ranks2, script_args=[
            *EXACT, "--strategy", strategy, "--checkpoint-dir", str(tmp / f"ck64-{strategy}"),
            "--checkpoint-every", "4", "--stop-after", "10"]) for strategy in ("ddp", "fsdp")}
        done["stopped"] = {strategy: finish(p) for strategy, p in stopped.items()}
        done["tmp"] = tmp
        return done
    return run_all


@pytest.fixture(scope="module")
def runs(request):
    return background.result(request, start_in_background, "torchrun")


def test_rank_killed_and_group_restarted_ends_bitwise_equal(runs):
    out = runs["crashed"]
    assert "rank 1: killing myself before step 25" in out      # the first attempt did die
    assert f"{script.RESUME_PREFIX}20" in out.splitlines()     # the newest checkpoint
    assert last_hash(out) == last_hash(runs["straight"])
    kept = sorted(p.name for p in runs["ckpt"].iterdir())
    assert kept == ["step_00000020", "step_00000030"]          # --keep 2, no .partial left
    assert sorted(p.name for p in (runs["ckpt"] / "step_00000030").iterdir() if p.suffix == ".pt") == \
        ["rank0.pt", "rank1.pt"]


def test_two_agents_as_two_nodes_equal_one_agent_with_two_processes(runs):
    outs = runs["agents"]
    printed = [o for o in outs if script.HASH_PREFIX in o]
    assert len(printed) == 1                                   # rank 0 prints, on one node
    assert last_hash(printed[0]) == last_hash(runs["straight"])


@pytest.fixture(scope="module")
def straight64(tmp_path_factory) -> dict:
    """The final weights of the fp64 run uninterrupted, in this process on one rank: with nothing
    random, the global batch fixes the run whatever the number of ranks (a 2-rank torchrun of it
    ended within 6e-17 of this), so the reference needs no torchrun of its own."""
    import torch
    path = tmp_path_factory.mktemp("straight64") / "weights.pt"
    script.main([*EXACT, "--final-weights", str(path)])
    return torch.load(path)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_on_another_number_of_ranks_continues_the_run(runs, straight64, strategy, capsys):
    """Written by 2 ranks (checkpoints every 4 steps, preempted after step 10, where it saves
    before leaving), resumed by 1 rank with the same global batch: DCP reshards the model and the
    AdamW state, the schedule and data position carry over. With nothing random (no noise, no
    dropout) in fp64 the final weights equal the uninterrupted run's up to summation order (had
    the ranks' first 10 steps or the resume been off, they would not); a different global batch
    is refused."""
    import torch
    tmp, ckpt = runs["tmp"], runs["tmp"] / f"ck64-{strategy}"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000008", "step_00000010"]
    capsys.readouterr()
    script.main([*EXACT, "--strategy", strategy, "--checkpoint-dir", str(ckpt),
                 "--final-weights", str(tmp / f"resumed-{strategy}.pt")])
    out = capsys.readouterr().out
    assert f"{script.RESUME_PREFIX}10" in out and "resharded: written by 2 ranks, resumed on 1" in out
    straight = straight64
    resumed = torch.load(tmp / f"resumed-{strategy}.pt")
    assert resumed.keys() == straight.keys()
    assert max((resumed[k] - straight[k]).abs().max().item() for k in straight) < 1e-12
    assert max((resumed[k] - straight[k]).abs().max().item() for k in straight) < \
        max(straight[k].abs().max().item() for k in straight)   # not trivially: the weights are not 0
    with pytest.raises(SystemExit, match="same global batch"):
        script.main([*EXACT[:2], "--batch", "32", *EXACT[4:], "--strategy", strategy,
                     "--checkpoint-dir", str(ckpt)])


# ------------------------------------------------------------------ in this process, one rank
def test_single_process_resume_across_epochs_is_exact(tmp_path, capsys):
    straight = script.main(EPOCH_ARGS)
    ckpt = tmp_path / "ckpt"
    first = script.main([*EPOCH_ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "6"])
    assert first == straight                                   # saving changes nothing
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000006", "step_00000012"]
    # drop the newest: resume from step 6 (epoch 1, batch 1) and run to 14 again
    shutil.rmtree(ckpt / "step_00000012")
    (ckpt / "step_00000013.partial").mkdir()                   # an unfinished save is ignored
    capsys.readouterr()
    resumed = script.main([*EPOCH_ARGS, "--checkpoint-dir", str(ckpt)])
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{script.RESUME_PREFIX}6", f"{script.HASH_PREFIX}{straight}"]
    assert resumed == straight
    other = script.main([*EPOCH_ARGS, "--seed", "1"])
    assert other != straight                                   # the hash does see the weights


def test_resume_restores_every_piece(tmp_path):
    """Break one piece of the checkpoint at a time: each changes the final hash."""
    import torch
    from course_utils import checkpoint as ck
    args = [*EPOCH_ARGS, "--checkpoint-dir", str(tmp_path)]
    straight = script.main([*args, "--checkpoint-every", "6"])
    saved = tmp_path / "step_00000006"
    rank_file = saved / "rank0.pt"
    original = ck.load(rank_file)
    broken = {
        "rng": {**original, "rng": {**original["rng"], "torch": torch.manual_seed(123).get_state()}},
        "position": {**original, "position": {**original["position"], "batch_index": 0}},
        "schedule": {**original, "schedule": {**original["schedule"], "last_epoch": 0}},
    }
    shutil.rmtree(tmp_path / "step_00000012")
    for piece, state in broken.items():
        ck.save(rank_file, state)
        assert script.main(args) != straight, f"resume ignored the {piece}"
    ck.save(rank_file, original)
    assert script.main(args) == straight


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        script.parse_args(["--crash-at-step", "0"])
    with pytest.raises(SystemExit):
        script.parse_args(["--checkpoint-every", "5"])        # no --checkpoint-dir
    with pytest.raises(SystemExit):
        script.parse_args(["--steps", "0"])


def test_newest_checkpoint_skips_partial_saves(tmp_path):
    assert script.newest_checkpoint(tmp_path / "missing") is None
    for name in ("step_00000004", "step_00000008", "step_00000012.partial"):
        (tmp_path / name).mkdir()
    assert script.newest_checkpoint(tmp_path).name == "step_00000008"
