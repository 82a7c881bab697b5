"""Pictures and pages: plotly figures, the HTML report, and the notebooks' interactive views.

- `pictures`: the group bar chart, the segment map, `show_in` for widgets;
- `report`: a self-contained HTML page for one snapshot;
- `rank_report`: every rank of a folder on one page (`python -m kit report DIR`);
- `stepthrough`: the root cause one allocator request at a time (`StepThrough`,
  and notebook 02's slider view `StepView`);
- `before_after`: two runs side by side and what changed (notebook 01's two captures,
  notebook 03's replica unpatched and patched);
- `timeline`: the blocks a model graph holds across its eager breaks (notebook 04);
- `safety`: the scenarios side by side and the policy explorer (notebook 04);
- `alternatives`: the PR's two alternatives, their graph pools and the KV cache the saving buys (notebook 05);
- `explorer`: any snapshot in, tables, verdicts and figures out (notebook 07).

Plotly is imported here only, so the tables and analyses run on a machine
that has pandas but no plotly (the GPU machine).
"""
