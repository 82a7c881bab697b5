"""Text from a snapshot, escaped wherever the kit renders it as HTML.

A snapshot names its own streams, pools and stack frames, so every label,
frame, origin and provenance line is the snapshot's to choose: a script run
at module level labels its stream "stream of <module> (file.py:46)", and a
crafted frame name can be `<img src=x onerror=...>`. The report, the styled
tables (`kit.style_table`, through pandas' `escape="html"`), the notebooks'
HTML widgets and plotly's titles, trace names, category labels and hover
text (plotly renders those as HTML too) all pass such text through
`html_text`, so it shows as written and never runs. Text printed to a
terminal stays as it is.
"""

from __future__ import annotations

_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#x27;"})


def html_text(value: object) -> str:
    """`value` as HTML text, so that it reads as written and never becomes markup.

    As `html.escape`, but `"` becomes `&#34;`: plotly decodes numeric
    references, `&lt;`, `&gt;` and `&amp;`, and would show `&quot;` as written.
    """
    return str(value).translate(_ESCAPES)
