"""Metrics and reports: summarize finished requests, compare runs, export and plot.

Quick use::

    from headway.metrics import summarize, write_report

    summary = summarize(requests, slo="ttft:500 tpot:50 e2el:2000", name="fcfs")
    write_report("out/", {"fcfs": (summary, requests)})

Definitions (times in seconds on the engine clock):

* TTFT = ``first_token_time - arrival_time``; E2E latency (TTLT) =
  ``finish_time - arrival_time``; queueing delay = ``first_scheduled_time -
  arrival_time``; normalized latency = E2E / output tokens (PARS's per-token latency).
* TPOT is each request's mean inter-token time,
  ``(last_token_time - first_token_time) / (num_output_tokens - 1)``. Requests do not
  store per-token gaps, so a per-gap TBT/ITL distribution cannot be computed; the
  TPOT statistics are over per-request means.
* Statistics (:class:`LatencyStats`): mean, min, p50/p90/p95/p99 and max, with
  percentiles by ``numpy.percentile(..., method="linear")`` (linear interpolation
  between order statistics), over FINISHED requests only.
* ABORTED requests are not completed: they are counted (by
  ``extra["abort_reason"]``), excluded from latency statistics and count as SLO misses.
* Rates (throughputs, goodput) divide by the makespan, first arrival to last finish.
* SLO attainment = requests meeting every given target / all requests; goodput =
  requests meeting every given target / makespan (``vllm bench serve --goodput``).
* Jain's fairness index = ``(Σx)² / (n Σx²)`` over tenants with ``x_i = 1 / mean
  normalized latency of tenant i`` (0 for a tenant with nothing completed).
* :func:`summarize` raises ``ValueError`` on an empty request list.
"""

from headway.metrics._export import (
    GROUP_COLUMNS,
    SUMMARY_COLUMNS,
    group_rows,
    read_json,
    read_replica_json,
    safe_filename,
    summary_row,
    write_groups_csv,
    write_json,
    write_requests_csv,
    write_summary_csv,
)
from headway.metrics._html import write_html_report
from headway.metrics._plots import (
    POLICY_FAMILIES,
    TimelineSample,
    figure_png,
    plot_latency_cdfs,
    plot_percentile_bars,
    plot_timeline,
    run_styles,
    save_figure,
)
from headway.metrics._report import ReportPaths, write_report
from headway.metrics._slo import SLO
from headway.metrics._stats import LatencyStats, jain_index, latency_stats
from headway.metrics._summary import REQUEST_COLUMNS, GroupSummary, RunSummary, request_rows, summarize
from headway.metrics._table import comparison_table, replica_overview

__all__ = [
    "GROUP_COLUMNS",
    "POLICY_FAMILIES",
    "REQUEST_COLUMNS",
    "SLO",
    "SUMMARY_COLUMNS",
    "GroupSummary",
    "LatencyStats",
    "ReportPaths",
    "RunSummary",
    "TimelineSample",
    "comparison_table",
    "figure_png",
    "group_rows",
    "jain_index",
    "latency_stats",
    "plot_latency_cdfs",
    "plot_percentile_bars",
    "plot_timeline",
    "read_json",
    "read_replica_json",
    "replica_overview",
    "request_rows",
    "run_styles",
    "safe_filename",
    "save_figure",
    "summarize",
    "summary_row",
    "write_groups_csv",
    "write_html_report",
    "write_json",
    "write_report",
    "write_requests_csv",
    "write_summary_csv",
]
