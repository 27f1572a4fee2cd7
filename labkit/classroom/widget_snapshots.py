"""A still picture of a notebook's widgets, for a page that runs no kernel.

An executed notebook keeps each widget's last state in its metadata
(``application/vnd.jupyter.widget-state+json``, saved by nbclient, so by papermill) and, in the
cell, only a reference to it. ``snapshot(output, state)`` turns that reference into ordinary
outputs: an ``Output`` widget's own outputs (a slider panel's plot stays a PNG), and plain
HTML for the controls (a slider shows its value, a progress bar its bar, a quiz its questions
and options), so the page shows what the notebook showed when it finished.
"""

from __future__ import annotations

import html

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
STATE_MIME = "application/vnd.jupyter.widget-state+json"
_BOXES = ("BoxModel", "HBoxModel", "VBoxModel", "GridBoxModel", "AccordionModel", "TabModel")
_CHOICES = ("DropdownModel", "RadioButtonsModel", "ToggleButtonsModel", "SelectModel")
_TEXT = ("HTMLModel", "HTMLMathModel", "LabelModel")


def widget_state(notebook) -> dict:
    """{model id: model} saved in an executed notebook (empty when it saved none)."""
    return notebook.metadata.get("widgets", {}).get(STATE_MIME, {}).get("state", {})


def is_widget(output) -> bool:
    return WIDGET_MIME in output.get("data", {})


def snapshot(output, state: dict) -> list[dict]:
    """The outputs that show the widget ``output`` refers to as it was last drawn."""
    model_id = output["data"][WIDGET_MIME]["model_id"]
    parts: list = []
    _walk(model_id, state, parts)
    shown, pending = [], []
    for part in parts + [None]:
        if isinstance(part, str):
            pending.append(part)
            continue
        if pending:
            shown.append(_html_output("".join(pending)))
            pending = []
        if part is not None:
            shown.append(part)
    return shown


def _html_output(body: str) -> dict:
    text = html.unescape(body.replace("<br>", "\n"))
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/html": f"<div class='labkit-widget'>{body}</div>",
                     "text/plain": text}}


def _walk(model_id: str, state: dict, parts: list) -> None:
    model = state.get(model_id.removeprefix("IPY_MODEL_"))
    if model is None:
        parts.append("<i>(a widget: run the notebook to use it)</i>")
        return
    name, values = model.get("model_name", ""), model.get("state", {})
    if name == "OutputModel":
        for out in values.get("outputs", []):
            parts.append({"metadata": {}, **out})
    elif name in _BOXES:
        inner: list = []
        for child in values.get("children", []):
            _walk(child, state, inner)
        if name == "HBoxModel" and all(isinstance(p, str) for p in inner):
            parts.append("<div style='display:flex;gap:1.5em;flex-wrap:wrap'>"
                         + "".join(f"<div>{p}</div>" for p in inner) + "</div>")
        else:
            parts.extend(inner)
    else:
        shown = _control(name, values)
        if shown:
            parts.append(shown)


def _control(name: str, values: dict) -> str:
    """One control as HTML: what it says and the value it held."""
    label = html.escape(str(values.get("description", "")))
    if name in _TEXT:
        value = str(values.get("value", ""))
        return html.escape(value) if name == "LabelModel" else value
    if name.endswith("ProgressModel"):
        return (f"{label} <progress value='{values.get('value', 0)}' "
                f"max='{values.get('max', 100)}'></progress>")
    options = values.get("_options_labels")
    if name.endswith("SliderModel") or name in _CHOICES:
        if options is not None:
            index = values.get("index")
            if index is None:  # nothing chosen yet: a question's options
                return ("<ol type='A'>" + "".join(f"<li>{html.escape(o)}</li>" for o in options)
                        + "</ol>")
            value = options[index] if isinstance(index, int) else \
                ", ".join(options[i] for i in index)
        else:
            value = values.get("value")
        return f"{label} <b>{html.escape(str(value))}</b>"
    if name in ("CheckboxModel", "ToggleButtonModel"):
        return f"{'&#9745;' if values.get('value') else '&#9744;'} {label}"
    if name == "ButtonModel":
        return f"<button disabled>{label}</button>"
    if name.endswith("TextModel") or name == "TextareaModel":
        return f"{label} <code>{html.escape(str(values.get('value', '')))}</code>"
    return ""
