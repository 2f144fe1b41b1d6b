"""The order the suite's modules start in: the unit tier first, then the longest modules.

With ``-n 4 --dist loadfile`` pytest-xdist hands out whole modules in the order it is given
them (``conftest.py`` turns off its own reordering, which puts the modules with the most
tests first, so that the one-test modules -- the soak, the README's fresh virtualenv, the
lossy link -- used to start last and stretch the run's tail by a minute or more). Handing
out the longest first (the classic longest-processing-time rule) lets the many short modules
fill the gaps at the end. The figures are seconds of one ``--durations=0`` run at ``-n 4``
on a loaded 2-core machine: only their order matters, and a module not listed (a new one)
comes after the listed ones, in pytest's own order. Refresh the table when a module's time
changes a lot (``--durations=0``, summed per module).
"""

from __future__ import annotations

from pathlib import Path

# tests/<folder>/<module>: seconds of setup, call and teardown together, longest first
# (s52: a module split in two -- hosts_ssh, store_failover, warm_semantics, soak -- gives each
# half the whole's figure times the half's share of their times alone, until a -n 4 run.)
LONGEST_FIRST: dict[str, float] = {
    "multinode/test_chaos.py": 171,
    # new in s49 (split from test_store_failover.py) and not listed, it started after every
    # listed module, with 205 s to go (ci56); 150 s alone at load 8 once its steps sped up
    "multinode/test_member_cut_off.py": 150,
    # s53: + two tests of 12-17 s alone (a signal during the node check); serial runs of the
    # module took 98 s with the first, 134 s with both, at load 3-6 (s52: 97, + a 19 s test)
    "supervisor/test_node_check.py": 134,
    "agent/test_runfiles_faults.py": 129,  # 136 while its hang waited 10 s from step 0
    "rendezvous/test_fencing.py": 126,  # 146 before its cut-off node gave up rejoining sooner
    "cli/test_hosts_ssh.py": 123,  # 201 before test_hosts_ssh_rounds.py was split from it
    "project/test_docs.py": 121,
    "multinode/test_multinode.py": 120,
    "worker/test_warm_torch.py": 119,  # split from test_warm_semantics.py (186 whole)
    "agent/test_preempt.py": 116,
    "cli/test_example_train.py": 114,
    "supervisor/test_hang.py": 113,
    "multinode/test_store_failover.py": 111,  # 190 before test_store_failover_ssh.py
    "agent/test_launch.py": 108,
    "project/test_soak.py": 101,  # 153 with the c10d soak, now test_soak_c10d.py
    "multinode/test_lossy_link.py": 90,
    "status/test_status.py": 84,
    "rendezvous/test_rdzv_waiting.py": 83,
    "agent/test_crash_loop.py": 80,
    "multinode/test_store_failover_ssh.py": 79,
    "cli/test_hosts_ssh_rounds.py": 78,
    "multinode/test_multinode_etcd.py": 76,
    "cli/test_inscript.py": 73,
    # s53: a second test (the late survivor, 24-35 s alone); both 51 s alone, was 37
    "multinode/test_store_back.py": 70,
    "agent/test_stacks.py": 69,
    "worker/test_warm_semantics.py": 67,
    "project/test_soak_c10d.py": 66,  # ci63: the soak 62 s
    "slurm/test_slurm_requeue_exclude.py": 66,
    "agent/test_failure_corpus.py": 64,
    "project/test_readme.py": 62,
    # new in s52 and not listed, it started after every listed module (ci63: its one test 49 s)
    "rendezvous/test_etcd_keys_bounded.py": 60,
    "rendezvous/test_spares.py": 59,
    "agent/test_log_backpressure.py": 56,
    "supervisor/test_stragglers.py": 55,
    "worker/test_warm_lifecycle.py": 55,
    "worker/test_checkpoint_faults.py": 52,
    "multinode/test_join_when_ready.py": 50,  # new in s49: 44 s alone at load 10
    "agent/test_last_word.py": 49,
    "multinode/test_multinode_consistency.py": 46,
    "status/test_status_progress.py": 43,
    "rendezvous/test_rdzv_auth.py": 41,
    "cli/test_cli.py": 40,
    "cli/test_torchrun_gaps.py": 39,
    "agent/test_slow_rundir.py": 38,
    "slurm/test_slurm_preempt.py": 38,
    "rendezvous/test_fence_rejoin.py": 38,
    "rendezvous/test_stop_during_restart.py": 36,
    "rendezvous/test_etcd_store.py": 35,
    "agent/test_runs_by_name.py": 33,
    "rendezvous/test_membership_change.py": 32,
    "agent/test_causal_root_cause.py": 30,  # 61 while its proxy stayed slow to the end
    "agent/test_wakeups.py": 25,
    "rendezvous/test_lost_during_restart.py": 24,
    "worker/test_checkpoint.py": 23,
    "cli/test_inscript_drop_in.py": 21,
    "agent/test_recovery_words.py": 21,
    "rendezvous/test_static_ports.py": 21,
}


def start_order(path: Path) -> tuple[bool, float]:
    """Sort key of a test module's items: the unit tier first (it fails fast on a pure
    mistake), then the listed modules longest first, then the rest (the sort is stable)."""
    tier = path.parent.name != "unit"
    return tier, -LONGEST_FIRST.get(f"{path.parent.name}/{path.name}", 0.0)
