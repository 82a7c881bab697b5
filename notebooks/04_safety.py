# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Is sharing safe? What is live across the eager break
#
# **The question.** PR 63155 lets the decoder replay graphs take the graph-pool blocks the
# model graphs freed. At run time those blocks belong to both graphs at once. The PR says
# that is safe: a replay graph runs inside an eager break of a model graph, after the break
# gathered its inputs into static buffers, and after the break the model graph reads only
# the break's output buffers, which live outside the pool. So no pool block the model graph
# still needs is live while the replay graph runs. The exception is aux hidden states
# produced before the replay layers: the forward holds them across the break.
#
# This notebook checks the argument three ways on the replica (vLLM's capture path in
# miniature, `kit.replica`): which pool blocks the trace shows live across each break, where
# the break's own allocations land, and whether graph outputs equal eager ones bit for bit.

# %%
import inspect
import tempfile
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display
from tqdm.auto import tqdm

import kit
import kit.patch.replica
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED
from kit.experiments.scenarios import SCENARIOS, run_all, summarize
from kit.experiments.two_captures import default_source
from kit.recordings import RECORDINGS as FIXTURES
from kit.replica.decoder_replay import DecoderReplayLayers
from kit.replica.model import replay_rows

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
SOURCE = default_source()  # set to "recorded" to use the H200 recordings on a GPU machine
PRESET = "small"
print(f"data source: {SOURCE}")

# %% [markdown]
# ## The PR's rule
#
# The patch hands the model graphs' stream to the replay graphs unless an aux hidden state
# comes before the replay layers. `policy="share"` drops the exception: the experiment the
# exception exists for.

# %%
print(inspect.getsource(kit.patch.replica.replay_stream))
print(inspect.getsource(DecoderReplayLayers.has_early_aux))

# %% [markdown]
# ## Four captures of the replica
#
# The replica (hidden 1024, 6 layers, replay layers from layer 3, sizes 128-512) is captured
# four ways. Each capture needs an empty allocator, so on a GPU each runs in a fresh process
# (`kit.experiments.scenarios.run_all`); without one, the H200 recordings of the same runs load.


# %%
def load_scenarios(source: str) -> dict[str, kit.Snapshot]:
    if source != "live GPU":
        return {name: kit.load_snapshot(FIXTURES / "replica" / f"{PRESET}_{name}.pickle") for name in SCENARIOS}
    out = Path(tempfile.mkdtemp(prefix="kit-safety-"))
    snapshots = {}
    for name in tqdm(SCENARIOS, desc="capturing, a fresh process each"):
        run_all(PRESET, out, names=(name,))
        raw = kit.load_snapshot(out / f"{PRESET}_{name}.pickle").raw
        snapshots[name] = kit.Snapshot(raw, origin=f"{PRESET} {name}, captured in a fresh process", live=True)
    return snapshots


def source_of(snapshot: kit.Snapshot) -> str:
    if snapshot.live:
        return f"live GPU ({snapshot.provenance['gpu']}, one fresh process per capture)"
    return snapshot.source_label


snapshots = load_scenarios(SOURCE)
print(f"data source: {SOURCE}: {source_of(snapshots['patched'])}")


def overview(name: str, snapshot: kit.Snapshot) -> dict:
    figures = summarize(snapshot)
    liveness = kit.liveness_table(snapshot).rows
    equivalence = kit.Equivalence(pd.DataFrame(snapshot.kit["equivalence"]))
    return {
        "scenario": name,
        "policy": figures["policy"],
        "early aux": snapshot.kit["scenario"]["has_early_aux"],
        "replay graphs on": ", ".join(figures["replay_capture_stream"]),
        "graph pool": kit.format_bytes(figures["graph_pool_reserved"]),
        "held after the break": kit.format_bytes(liveness[liveness["class"] == HELD]["bytes"].sum()),
        "of it under a replay graph": kit.format_bytes(liveness[liveness["conflict"]]["bytes"].sum()),
        "breaks allocate outside the pool": bool(kit.break_allocations(snapshot)["outside_pool"].all()),
        "graphs vs eager": "bit-exact" if equivalence.bit_exact else f"differ, up to {equivalence.max_abs_diff:.3g}",
    }


table = pd.DataFrame([overview(name, snap) for name, snap in snapshots.items()])
table.attrs["source"] = source_of(snapshots["patched"])
kit.style_table(table)

# %% [markdown]
# The last three columns are the three checks. The rest of the notebook takes them one at
# a time, on the PR's own case first (`patched`: no early aux, replay graphs on the model
# graphs' stream).
#
# ## 1. Which pool blocks are live across the break
#
# The capture recorder logs one trace window per graph: a breakable capture's consecutive
# graphs are its segments, and the gaps between them are its eager breaks. Trace entries
# carry no pool, so `kit.liveness_table` maps each allocation to its segment (as
# `kit.replay_trace` does) and lists, per model capture and break, every block of the graph
# pool allocated before the break and not freed before it began. Each gets a class:
# - **released by the break**: freed after the break began and before the next graph
#   segment's first allocation: the forward dropped it as the break returned;
# - **break input**: where a break released nothing, the newest block held across it, the
#   tensor the break was called with (see the note below);
# - **held after the break**: freed later or never: the model graph may still read it.
#
# Then it looks for replay-graph allocations over each block's bytes.


# %%
def liveness_view(liveness: pd.DataFrame, source: str):
    columns = ["capture", "break", "addr", "bytes", "class", "alloc_index", "free_index", "alloc_frame"]
    view = liveness[[*columns, "free_frame", "overlapping_replay", "replay_in_break", "conflict"]].copy()
    view.attrs["source"] = source
    names = ", ".join
    return kit.style_table(view).format(
        {
            "addr": "{:#x}".format,
            "bytes": kit.format_bytes,
            "free_index": lambda v: "never" if pd.isna(v) else f"{int(v)}",
            "overlapping_replay": names,
            "replay_in_break": names,
        }
    )


patched = snapshots["patched"]
liveness_view(kit.liveness_table(patched, replay_size_for=replay_rows).rows, source_of(patched))

# %%
for line in kit.liveness_verdicts(kit.liveness_table(patched, replay_size_for=replay_rows)):
    print(line)

# %% [markdown]
# One block per break, the size of the hidden states (tokens x 1024 x 2 bytes): the input
# of the replay layers. `replay_size_for=replay_rows` tells the analysis which replay graph
# runs in which break (the replica's replay batch is half the rows: model graph 256 runs
# replay graph 128); without it, any replay graph is assumed to run in any break, as in
# vLLM, where the step's replay rows pick it.
#
# Replay graph 128 *is* captured over model graph 256's break input, and runs in that
# break. It is harmless because nothing reads that block after the break, which the
# equivalence check below confirms.
#
# **A note on the trace.** The break input is freed only at the end of the capture here,
# not as the break returns: on Python 3.12 and older, the recorder's stack walk (it reads
# each frame's locals to find the graph manager) keeps the forward's locals alive until the
# forward returns. That is why no block is *released by the break* in these recordings, and
# why the analysis takes the newest held block as the break's input when nothing was
# released. (Checked on the H200: with the walk made to drop those locals, the same capture
# frees the break input in the first event after the break, and it reads as released.)
#
# ## 2. The break's outputs live outside the pool
#
# The break runs eagerly, between two graph segments, outside any capture, so what it
# allocates should land in the default pool: its gather, the replay layers' activations (at capture time they run
# eagerly), and the output buffers the next segment reads. `kit.break_allocations` checks
# every allocation in every break window.

# %%
breaks = kit.break_allocations(patched)
breaks.attrs["source"] = source_of(patched)
kit.style_table(breaks).format({"bytes": kit.format_bytes, "pool_bytes": kit.format_bytes})

# %% [markdown]
# ## 3. Graphs against eager
#
# `kit.check_equivalence` ran right after each capture: fresh token ids through the graphs
# and through the same weights eagerly, every capture size, every output, compared bit for
# bit. On the GPU it ran in the live capture's process; the recordings carry its rows.


# %%
def equivalence_of(snapshot: kit.Snapshot) -> kit.Equivalence:
    return kit.Equivalence(pd.DataFrame(snapshot.kit["equivalence"]))


def equivalence_view(snapshot: kit.Snapshot):
    rows = equivalence_of(snapshot).rows.copy()
    rows.attrs["source"] = source_of(snapshot)
    return kit.style_table(rows)


print(f"patched: {equivalence_of(patched).summary()}")
equivalence_view(patched)

# %% [markdown]
# ## The exception: aux hidden states before the replay layers
#
# Now add an aux hidden state at layer 1 (the input of layer 1, for an EAGLE-style
# speculator): the forward keeps it from layer 1 to its return, across the break.
# `early_aux_shared` forces the replay graphs onto the model graphs' stream anyway.

# %%
forced = snapshots["early_aux_shared"]
forced_liveness = kit.liveness_table(forced, replay_size_for=replay_rows)
for line in kit.liveness_verdicts(forced_liveness):
    print(line)
liveness_view(forced_liveness.rows, source_of(forced))

# %% [markdown]
# Each break now holds two blocks: the break input, and the aux hidden state, *held after
# the break* (freed when the capture drops the forward's outputs). The replay graphs were
# captured over some of them. Over the break input that is harmless, as before; over the aux
# hidden state it is a conflict when the replay graph that does so runs in that break.
# Which sizes does the trace predict will differ from eager, and which do?

# %%
predicted = sorted({int(s) for s in forced_liveness.rows[forced_liveness.rows["conflict"]]["capture_size"]})
rows = equivalence_of(forced).rows
measured = sorted({int(s) for s in rows[~rows["bit_exact"]]["size"]})
print(f"early_aux_shared: {equivalence_of(forced).summary()}")
print(f"sizes the liveness analysis flags: {predicted}; sizes whose graph outputs differ from eager: {measured}")
print("conservatively (any replay graph in any break):")
for line in kit.liveness_verdicts(kit.liveness_table(forced)):
    print(f"  {line}")
equivalence_view(forced)

# %% [markdown]
# The trace alone finds the tensor that goes wrong: the aux hidden state, and only where
# the replay graph running in the break was captured over it. Model graphs 512 and 128 hold
# an aux hidden state over which *another* replay graph was captured; in vLLM, where any
# replay graph may run in any break, they would be at risk too.
#
# Under the PR's own rule (`early_aux_pr`) `has_early_aux()` is true, the replay graphs keep
# a stream of their own, and nothing is captured over the held block:

# %%
aux_pr = snapshots["early_aux_pr"]
for line in kit.liveness_verdicts(kit.liveness_table(aux_pr, replay_size_for=replay_rows)):
    print(line)
print(f"early_aux_pr: {equivalence_of(aux_pr).summary()}")

# %% [markdown]
# ## Look for yourself
#
# Pick the stream policy and whether an aux hidden state comes before the replay layers. The
# PR's rule picks the replay graphs' stream, and with it the capture shown. Each bar is a
# block held across a break, from its allocation to its free (trace index); grey bands are
# the eager breaks, orange ones the replay captures; a cross marks a replay allocation over
# the block by the replay graph that runs in that break, a circle one by another replay
# graph.

# %%
COLOURS = {RELEASED: "#27ae60", BREAK_INPUT: "#2980b9", HELD: "#c0392b"}
MARKS = {  # does the replay graph that allocated over the block run in the block's break?
    True: ("a replay graph of this break allocates here", "x", "black"),
    False: ("a replay graph of another break allocates here", "circle-open", "grey"),
}
tables = {name: kit.liveness_table(snap, replay_size_for=replay_rows).rows for name, snap in snapshots.items()}


def scenario_for(policy_name: str, has_early_aux: bool) -> tuple[str, bool]:
    """Whether the PR's rule shares the stream under this policy, and the capture that did the same."""
    shares = kit.patch.replica.replay_stream(policy_name, has_early_aux, "model graphs stream") is not None
    if has_early_aux:
        return ("early_aux_shared" if shares else "early_aux_pr"), shares
    return ("patched" if shares else "unpatched"), shares


def bands(snapshot: kit.Snapshot) -> list[dict]:
    """Grey: the eager breaks; orange: the replay captures."""
    shapes = []
    graphs = snapshot.kit["captures"]
    for before, after in zip(graphs, graphs[1:], strict=False):
        if before["capture"] == after["capture"]:
            shapes.append(dict(x0=before["trace_end"], x1=after["trace_begin"], fillcolor="#7f8c8d"))
    for g in graphs:
        if "replay" in g["manager"]:
            shapes.append(dict(x0=g["trace_begin"], x1=g["trace_end"], fillcolor="#e67e22"))
    common = dict(type="rect", xref="x", yref="paper", y0=0, y1=1, opacity=0.15, line_width=0, layer="below")
    return [{**common, **s} for s in shapes]


def timeline_figure(snapshot: kit.Snapshot, liveness: pd.DataFrame, title: str) -> go.Figure:
    """Per held block a bar from its allocation to its free; the replay allocations over it marked."""
    end = len(snapshot.trace)
    labels = [f"{r.capture_size}: {r.addr:#x} ({kit.format_bytes(r.bytes)})" for r in liveness.itertuples(index=False)]
    fig = go.Figure()
    for cls, colour in COLOURS.items():
        mine = (liveness["class"] == cls).tolist()
        rows = liveness[mine]
        frees = rows["free_index"].fillna(end).astype(int)
        hover = [
            f"{r['capture']}, break {r['break']}: {kit.format_bytes(r['bytes'])} at {r['addr']:#x}<br>"
            f"allocated at {r['alloc_frame']} (trace {r['alloc_index']}), freed at trace {f}"
            for (_, r), f in zip(rows.iterrows(), frees, strict=True)
        ]
        fig.add_bar(
            orientation="h",
            name=cls,
            marker_color=colour,
            y=[label for label, m in zip(labels, mine, strict=True) if m],
            base=rows["alloc_index"].tolist(),
            x=(frees - rows["alloc_index"]).tolist(),
            hovertext=hover,
            hovertemplate="%{hovertext}<extra></extra>",
        )
    for runs, (name, symbol, colour) in MARKS.items():
        points = [
            (index, label)
            for label, r in zip(labels, liveness.itertuples(index=False), strict=True)
            for replay, index in r.replay_overlaps
            if (replay in r.replay_in_break) == runs
        ]
        fig.add_scatter(
            mode="markers",
            name=name,
            marker=dict(symbol=symbol, size=12, color=colour),
            x=[x for x, _ in points],
            y=[y for _, y in points],
        )
    fig.update_layout(
        title=f"{title}<br><sup>source: {source_of(snapshot)}</sup>",
        shapes=bands(snapshot),
        barmode="overlay",
        xaxis_title="trace index (allocator events, in order)",
        yaxis=dict(categoryorder="array", categoryarray=labels, autorange="reversed", title="model graph: block"),
        legend=dict(orientation="h", yanchor="top", y=-0.25),
        height=320 + 40 * len(labels),
    )
    return fig


def shown(policy_name: str, has_early_aux: bool) -> tuple[str, bool, go.Figure]:
    name, shares = scenario_for(policy_name, has_early_aux)
    title = f"Pool blocks held across the eager breaks: policy {policy_name}, early aux {has_early_aux}"
    return name, shares, timeline_figure(snapshots[name], tables[name], title)


policy = widgets.ToggleButtons(options=[("pr", "pr"), ("share (forced)", "share")], description="policy")
policy.add_class("kit-main-control")
early_aux = widgets.Checkbox(
    value=True,
    description="aux hidden state at layer 1 (before the replay layers)",
    indent=False,
    layout={"width": "auto"},
)
status, liveness_html, equivalence_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
timeline = go.FigureWidget(shown(policy.value, early_aux.value)[2])  # the first view, also in a saved page


def update(change=None) -> None:
    name, shares, fig = shown(policy.value, early_aux.value)
    kit.show_in(timeline, fig)
    snapshot = snapshots[name]
    decision = "share the model graphs' stream" if shares else "keep a stream of their own"
    status.value = (
        f"<b>policy {policy.value}, early aux {'on' if early_aux.value else 'off'}</b>: the replay graphs "
        f"{decision}; capture <code>{name}</code>; graphs vs eager: {equivalence_of(snapshot).summary()}<br>"
        + "<br>".join(kit.liveness_verdicts(tables[name]))
    )
    liveness_html.value = liveness_view(tables[name], source_of(snapshot)).to_html()
    equivalence_html.value = equivalence_view(snapshot).to_html()


policy.observe(update, names="value")
early_aux.observe(update, names="value")
update()
display(widgets.VBox([widgets.HBox([policy, early_aux]), status, timeline, liveness_html, equivalence_html]))

# %% [markdown]
# **What it shows.** Across each eager break the model graph holds the break's input, which
# nothing reads afterwards, and, with an early aux layer, the aux hidden state, which the
# forward returns. The break's own allocations all land outside the pool. Sharing the stream
# lets the replay graphs take both blocks; only the aux hidden state makes that a conflict,
# and the trace finds it, down to the capture size whose outputs then differ from eager. The
# PR's `has_early_aux()` rule keeps exactly that case off the shared stream.
#
# **Next question.** These are the replica's captures. What does your own snapshot show?
# `05_your_snapshot` runs the same tables and figures on any `_dump_snapshot` pickle.
