"""Pictures and pages: plotly figures, the HTML report, and the notebooks' interactive views.

- `pictures`: the group bar chart, the segment map, `show_in` for widgets;
- `report`: a self-contained HTML page for one snapshot;
- `stepthrough`: the root cause one allocator request at a time.

Plotly is imported here only, so the tables and analyses run on a machine
that has pandas but no plotly (the GPU machine).
"""
