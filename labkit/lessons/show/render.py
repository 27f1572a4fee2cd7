"""Put a Figure into an ipywidgets Output (in a live kernel and in plain Python alike), and
run slow widget work off the kernel's thread without piling it up."""

from __future__ import annotations

import threading

from matplotlib.figure import Figure

from labkit.lessons.show.display import figure_png


def show_figure(output, fig: Figure) -> None:
    """Replace ``output``'s content by ``fig`` as a PNG. Assigning outputs (rather than
    ``with output:``) works without a kernel too, so widget callbacks are testable."""
    from IPython.display import Image

    output.outputs = ()
    output.append_display_data(Image(figure_png(fig)))


class LatestOnly:
    """Runs ``work(value)`` for the newest value only, in a background thread.

    A slider fires once per value it passes; training for each would pile up. Here a value
    that arrives while one is running replaces any other waiting value, so at most one run is
    queued, and the kernel stays free to take slider events meanwhile.
    ``background=False`` runs synchronously (plain pytest, no kernel).
    """

    def __init__(self, work, background: bool = True):
        self._work, self._background = work, background
        self._lock = threading.Lock()
        self._pending = _NOTHING
        self._thread: threading.Thread | None = None

    def submit(self, value) -> None:
        if not self._background:
            self._work(value)
            return
        with self._lock:
            self._pending = value
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, daemon=True)
                self._thread.start()

    def _drain(self) -> None:
        while True:
            with self._lock:
                value, self._pending = self._pending, _NOTHING
                if value is _NOTHING:
                    return
            self._work(value)

    def wait(self, timeout: float | None = None) -> None:
        """Block until nothing is running or waiting."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)


_NOTHING = object()


def slider_panel(controls: list, figure_for, describe, message_for=None,
                 background: bool = True):
    """Controls over a plot that redraws for their values, the way every explorer works:
    ``figure_for(*values)`` makes the Figure (running what it needs, off the kernel thread),
    ``describe(*values)`` says what is running, ``message_for(*values)`` adds a line below.
    Errors are shown in the panel; the kernel never hangs on a slider."""
    import html

    import ipywidgets as widgets

    plot, status, message = widgets.Output(), widgets.HTML(), widgets.HTML()

    def draw(values: tuple) -> None:
        status.value = f"<i>{html.escape(describe(*values))} ...</i>"
        try:
            show_figure(plot, figure_for(*values))
            if message_for is not None:
                message.value = message_for(*values)
            status.value = ""
        except Exception as exc:  # noqa: BLE001 - a widget shows its errors, never hangs
            status.value = (f"<span style='color:firebrick'>{type(exc).__name__}: "
                            f"{html.escape(str(exc))}</span>")

    def current() -> tuple:
        return tuple(control.value for control in controls)

    runner = LatestOnly(draw, background)
    for control in controls:
        control.observe(lambda change: runner.submit(current()), names="value")
    draw(current())  # the first figure before the cell returns
    box = widgets.VBox([widgets.HBox(controls), status, plot, message])
    box.plot, box.status, box.message, box.runner = plot, status, message, runner
    return box
