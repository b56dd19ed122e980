"""Holistic Trace Analysis (pinned, python/requirements-torch.txt) on the
merged PyTorch ranks of the end-to-end test's distributed job.

usage: hta_check.py TRACE_DIR   (only the merged *.pt.trace.json files)
prints one JSON object: the ranks HTA loaded, the iterations (ProfilerStep)
it found per rank, and the rows of its communication/computation overlap
(which HTA computes from GPU kernels: NaN for this CPU-only job); its
temporal breakdown needs GPU kernels too and raises on CPU-only traces,
which is reported, not hidden.
"""

import json
import sys


def main():
    from hta.trace_analysis import TraceAnalysis

    analyzer = TraceAnalysis(trace_dir=sys.argv[1])
    traces = analyzer.t.get_all_traces()
    names = analyzer.t.symbol_table.sym_table
    steps = {}
    for rank, df in traces.items():
        step_names = df["name"].map(lambda i: names[i]).str.startswith("ProfilerStep#")
        steps[rank] = int(step_names.sum())
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    try:
        analyzer.get_temporal_breakdown(visualize=False)
        breakdown = "ok"
    except Exception as e:  # HTA's own limit: no GPU kernels to break down
        breakdown = f"{type(e).__name__}: {e}"
    print(
        json.dumps(
            {
                "ranks": sorted(int(r) for r in traces),
                "steps": {str(r): n for r, n in steps.items()},
                "overlap_ranks": sorted(int(r) for r in overlap["rank"]),
                "temporal_breakdown": breakdown,
            }
        )
    )


if __name__ == "__main__":
    main()
