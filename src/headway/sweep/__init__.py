"""Experiment sweeps: grids of simulations run as Ray tasks (or in-process)."""

from headway.sweep._grid import Grid, Task, load_grid
from headway.sweep._runner import TaskResult, aggregate, max_rates, run_sweep, run_task

__all__ = ["Grid", "Task", "TaskResult", "aggregate", "load_grid", "max_rates", "run_sweep", "run_task"]
