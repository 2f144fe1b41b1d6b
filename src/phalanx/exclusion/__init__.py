"""Nodes kept out of a job (``--exclude-after``, ``--exclude-file``, the node check and the
straggler watch under ``exclude``): the file that remembers them (``file``) and
``--exclude-after``'s streak (``streak``)."""

from phalanx.exclusion.file import (
    EXCLUDED_EXIT_CODE,
    FILE_NAME,
    Exclusion,
    NodeName,
    exclude,
    excluded,
    exclusion_of,
    exclusions,
    record,
    refuse_if_excluded,
    requeue_exclusions,
    slurm_names,
    this_node,
)
from phalanx.exclusion.streak import ExcludeAfter, Streak, cause_is_here

__all__ = [
    "EXCLUDED_EXIT_CODE",
    "FILE_NAME",
    "ExcludeAfter",
    "Exclusion",
    "NodeName",
    "Streak",
    "cause_is_here",
    "exclude",
    "excluded",
    "exclusion_of",
    "exclusions",
    "record",
    "refuse_if_excluded",
    "requeue_exclusions",
    "slurm_names",
    "this_node",
]
