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

# tests/<folder>/<module>: seconds of setup, call and teardown together, longest first, from
# one --durations=0 run at -n 4 on the loaded 2-core machine (s55, 3342 s in all: /tmp/dur55.log),
# every module of 3 s or more outside the unit tier (which starts first whatever its figure);
# a module that s56's changes sped up has that figure scaled by its cut, measured alone.
LONGEST_FIRST: dict[str, float] = {
    # s53: + two tests of 12-17 s alone (a signal during the node check); s55: + its restart
    # test's second case (warned), 5 s
    "supervisor/test_node_check.py": 131,
    "cli/test_example_train.py": 110,
    # new in s49 (split from test_store_failover.py); 150 s alone at load 8 once its steps sped up
    # (s56 alone: 118 -> 107 s)
    "multinode/test_member_cut_off.py": 107,
    # was 171 (an older, more loaded run): its tests took no longer in s53 than in s55
    "multinode/test_chaos.py": 104,
    # 111 -> 132 (s53 -> s55 runs); s56 alone: 104 -> 77 s (steps left go without a pause)
    "multinode/test_store_failover.py": 98,
    "supervisor/test_hang.py": 92,
    # 128 in s55: its two grace tests waited 30 s each for a frozen or cut-off store's
    # first answer (read_timeout), past close_timeout; s56 alone: 130 -> 87 s
    "rendezvous/test_fencing.py": 86,
    "multinode/test_lossy_link.py": 81,
    "project/test_soak.py": 81,
    # was 120 (an older run); 60 in s53's, 67 in s55's
    "multinode/test_multinode.py": 67,
    "multinode/test_store_failover_ssh.py": 64,  # s56 alone: 74 -> 62 s
    "cli/test_inscript.py": 63,
    "multinode/test_multinode_etcd.py": 61,
    "agent/test_crash_loop.py": 57,
    # 201 before test_hosts_ssh_rounds.py was split from it; 123 in s52's run, 50-54 since
    "cli/test_hosts_ssh.py": 54,
    "project/test_soak_c10d.py": 53,
    "agent/test_slow_rundir.py": 51,
    "rendezvous/test_rdzv_waiting.py": 51,
    "supervisor/test_stragglers.py": 50,
    "cli/test_hosts_ssh_rounds.py": 50,
    "rendezvous/test_spares.py": 49,
    "project/test_readme.py": 48,
    "agent/test_log_backpressure.py": 44,
    "status/test_status.py": 44,
    "agent/test_preempt.py": 43,
    "multinode/test_store_back.py": 42,  # s56 alone: 60 -> 46 s
    "agent/test_stacks.py": 40,
    "agent/test_launch.py": 38,
    "slurm/test_slurm_preempt.py": 37,
    "slurm/test_slurm_requeue_exclude.py": 35,
    "multinode/test_multinode_consistency.py": 34,
    "rendezvous/test_etcd_keys_bounded.py": 34,
    # not listed before s56, like every module below that has no figure in the old table
    # (test_frozen_found_between_beats, test_hang_stop, test_etcd_wait, ...): each started
    # after every listed module
    "multinode/test_last_step.py": 33,
    "rendezvous/test_fence_rejoin.py": 33,
    # 51 in s55: its store-host case waited close_timeout's default 30 s; s56 alone: 51 -> 33 s
    "rendezvous/test_lost_during_restart.py": 33,
    "rendezvous/test_stopped_while_joining.py": 33,
    "rendezvous/test_etcd_store.py": 33,
    # its corpus fixture alone takes 33 s (its first test's setup)
    "supervisor/test_hang_corpus.py": 33,
    "rendezvous/test_stop_during_restart.py": 32,
    "multinode/test_join_when_ready.py": 31,
    # was 121 (an older run); 56 in s53's, 30 in s55's
    "project/test_docs.py": 30,
    "rendezvous/test_membership_change.py": 29,
    "multinode/test_spare_follows_store.py": 29,
    "rendezvous/test_rdzv_auth.py": 28,
    "worker/test_checkpoint_faults.py": 27,
    # 136 while its hang waited 10 s from step 0, then 129; 20-26 in the s53 and s55 runs
    "agent/test_runfiles_faults.py": 26,
    "agent/test_last_word.py": 25,
    "agent/test_failure_corpus.py": 23,
    # split from test_warm_semantics.py (186 whole): 119 then, 26 in s53's run, 20 in s55's
    "worker/test_warm_torch.py": 20,
    "worker/test_warm_semantics.py": 20,
    "status/test_status_progress.py": 19,
    "worker/test_warm_service.py": 18,
    "multinode/test_frozen_found_between_beats.py": 17,
    "rendezvous/test_rdzv_real.py": 17,
    "rendezvous/test_watchers_gone.py": 17,
    "agent/test_wakeups.py": 16,
    "rendezvous/test_rejoin.py": 14,
    "agent/test_recovery_words.py": 14,
    "agent/test_causal_root_cause.py": 14,
    "cli/test_schedulers.py": 14,
    "rendezvous/test_shared_endpoint.py": 14,
    "supervisor/test_node_check_firewall.py": 13,
    "cli/test_inscript_drop_in.py": 13,
    "supervisor/test_hang_stop.py": 13,
    "rendezvous/test_all_members_gone.py": 13,
    "worker/test_warm_lifecycle.py": 13,
    "multinode/test_env_two_nodes.py": 13,
    "multinode/test_newcomer_follows_store.py": 12,
    "rendezvous/test_store_load.py": 12,
    "rendezvous/test_round_trips.py": 11,
    "rendezvous/test_clock_skew.py": 11,
    "rendezvous/test_rdzv_growth.py": 10,
    "cli/test_cli.py": 10,
    "rendezvous/test_agent_store.py": 10,
    "rendezvous/test_etcd_junk.py": 10,
    "worker/test_cgroup_sweep.py": 9,
    "slurm/test_slurm.py": 9,
    "worker/test_python_reference.py": 9,
    "rendezvous/test_static_ports.py": 8,
    "agent/test_runs_by_name.py": 8,
    "multinode/test_store_lost_while_judging.py": 8,
    "supervisor/test_soak_hang.py": 7,
    "worker/test_checkpoint.py": 7,
    "worker/test_spawn_owner_tools.py": 7,
    "multinode/test_died_told_first.py": 7,
    "worker/test_warm_service_death.py": 7,
    "cli/test_hosts_all_lost.py": 7,
    "cli/test_torchrun_gaps.py": 7,
    "worker/test_dist.py": 6,
    "agent/test_events.py": 6,
    "rendezvous/test_stop_while_joining.py": 6,
    "agent/test_guardian_lost.py": 5,
    "status/test_timeline.py": 5,
    "worker/test_teardown.py": 5,
    "cli/test_hosts_excluded.py": 5,
    "rendezvous/test_etcd_wait.py": 5,
    "rendezvous/test_etcd_killed.py": 4,
    "agent/test_last_word_unsaid.py": 4,
    "rendezvous/test_etcd_credentials.py": 4,
    "agent/test_exclusion.py": 4,
    "agent/test_no_growth.py": 4,
    "worker/test_warm_batch.py": 4,
    "rendezvous/test_static_classic.py": 4,
    "rendezvous/test_rdzv_etcd.py": 4,
    "cli/test_torchrun_flags.py": 3,
    "worker/test_terminal_hangup.py": 3,
    "worker/test_warm_preload.py": 3,
    "agent/test_metrics.py": 3,
    "cli/test_wording.py": 3,
}


def start_order(path: Path) -> tuple[bool, float]:
    """Sort key of a test module's items: the unit tier first (it fails fast on a pure
    mistake), then the listed modules longest first, then the rest (the sort is stable)."""
    tier = path.parent.name != "unit"
    return tier, -LONGEST_FIRST.get(f"{path.parent.name}/{path.name}", 0.0)
