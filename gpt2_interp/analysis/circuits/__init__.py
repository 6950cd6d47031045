"""Circuits: the tasks a circuit is found on (prompt pairs with their metric) and the model's own
performance on them (``tasks``)."""

from .tasks import (
    GREATER_THAN_NOUNS,
    IOI_NAMES,
    IOI_TEMPLATES,
    TASKS,
    ProbMassDiff,
    Task,
    TaskPerformance,
    fact_recall,
    greater_than,
    ioi,
    ioi_names,
    last_logits,
    make_task,
    performance,
    year_tokens,
)

__all__ = [
    "GREATER_THAN_NOUNS",
    "IOI_NAMES",
    "IOI_TEMPLATES",
    "TASKS",
    "ProbMassDiff",
    "Task",
    "TaskPerformance",
    "fact_recall",
    "greater_than",
    "ioi",
    "ioi_names",
    "last_logits",
    "make_task",
    "performance",
    "year_tokens",
]
