"""guozhuang.torch.elastic (Horovod's hvd.elastic.run / TorchState shape) over gzrun restarts."""
import os
import re
import stat
import subprocess

from conftest import PYTHON, WORKERS, env, gzrun


def ran(out, rank):
    """Steps that `rank` printed, in order (gzrun prefixes each line with "[rank] ")."""
    return [int(s) for s in re.findall(rf"^(?:\[{rank}\] )?RAN {rank} (\d+)$", out, re.M)]


def final(out):
    m = re.search(r"FINAL ([0-9a-f]+)", out)
    assert m, out[-3000:]
    return m.group(1)


def test_killed_worker_resumes_from_its_last_commit(tmp_path):
    steps, kill_at = 10, 4
    ref = gzrun("elastic_state.py", 2, steps, 0, extra_env={"GZ_ELASTIC_DIR": tmp_path / "ref"})
    assert ref.returncode == 0, ref
    r = gzrun("elastic_state.py", 2, steps, kill_at, launcher_args=("--max-restarts", "1"),
              extra_env={"GZ_ELASTIC_DIR": tmp_path / "kill"})
    assert r.returncode == 0, r
    m = re.search(r"restored commit (\d+)", r.out)
    assert m, r
    # Commits count from 0 (commit c holds step c + 1). One rank per node writes: if the victim
    # was the other one, the writer's commit of the victim's last step survives (0 steps redone);
    # if the victim was the writer, the commit before it (1 step redone, the bound).
    restored = int(m.group(1))
    assert restored in (kill_at - 1, kill_at - 2), r
    for rank in (0, 1):
        assert ran(r.out, rank) == list(range(1, kill_at + 1)) + list(range(restored + 2, steps + 1)), (rank, r)
    assert final(r.out) == final(ref.out), "the resumed run must end with the uninterrupted run's parameters"
    assert not os.listdir(tmp_path / "kill" / f"gz-elastic-{os.getuid()}"), "a finished job leaves no state behind"


def test_a_rank_whose_node_lost_its_commits_gets_them_from_a_peer(tmp_path):
    # Rank 0 dies after step 4's update, before committing it, and its "node" (folder) is gone at
    # the restart: only rank 1's node holds commit 3, so rank 1 must restore it and send it to rank 0.
    steps, kill_at = 8, 4
    ref = gzrun("elastic_state.py", 2, steps, 0, extra_env={"GZ_ELASTIC_DIR": tmp_path / "ref"})
    r = gzrun("elastic_state.py", 2, steps, kill_at, 0, "nodes", launcher_args=("--max-restarts", "1"),
              extra_env={"GZ_ELASTIC_DIR": tmp_path / "kill"})
    assert r.returncode == 0, r
    assert f"restored commit {kill_at - 1} (from rank 1's node)" in r.out, r
    assert ran(r.out, 0) == list(range(1, steps + 1)), r
    assert final(r.out) == final(ref.out), "rank 0 must continue from rank 1's commit"


def test_a_new_job_does_not_restore_an_old_jobs_state(tmp_path):
    failed = gzrun("elastic_state.py", 2, 8, 3, extra_env={"GZ_ELASTIC_DIR": tmp_path})  # no restart: it fails
    assert failed.returncode != 0, failed
    leftovers = os.listdir(tmp_path / f"gz-elastic-{os.getuid()}")
    assert leftovers, "the failed job's commits stay (its gzrun could have restarted it)"
    again = gzrun("elastic_state.py", 2, 8, 0, extra_env={"GZ_ELASTIC_DIR": tmp_path})
    assert again.returncode == 0, again
    assert "restored commit" not in again.out, again
    assert ran(again.out, 0) == list(range(1, 9)), again


def lone(tmp_path):
    return subprocess.run([PYTHON, os.path.join(WORKERS, "elastic_state.py"), "2", "0"],
                          env=env(GZ_ELASTIC_DIR=tmp_path, GZ_ELASTIC_RUN_ID="job1"), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


def test_a_folder_others_can_write_or_a_symlink_is_refused(tmp_path):
    shared = tmp_path / f"gz-elastic-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    p = lone(tmp_path)
    assert p.returncode != 0 and "not a private folder" in p.stdout, p.stdout
    shared.chmod(0o700)
    p = lone(tmp_path)
    assert p.returncode == 0 and "FINAL" in p.stdout, p.stdout
    shared.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    shared.symlink_to(tmp_path / "elsewhere")
    p = lone(tmp_path)
    assert p.returncode != 0 and "not a private folder" in p.stdout, p.stdout


def test_ranks_started_in_different_rounds_agree_on_one_writer(tmp_path):
    """A moved survivor (its old GZ_RESTART_COUNT) and a fresh worker on one node: one writer.
    Mutation (run): claiming with this rank's own GZ_RESTART_COUNT gives 2 writers."""
    r = gzrun("elastic_writer.py", 2, extra_env={"GZ_ELASTIC_DIR": tmp_path})
    assert r.returncode == 0, r
    assert r.out.count("WRITERS 1") == 2, r
