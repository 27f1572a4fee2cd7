"""Widgets for the notebooks: each renders a static Figure too, for headless runs."""

from labkit.widgets.memory import MemoryExplorer, memory_explorer
from labkit.widgets.quiz import load_quiz, quiz_html, quiz_widget, show_quiz

__all__ = ["MemoryExplorer", "load_quiz", "memory_explorer", "quiz_html", "quiz_widget",
           "show_quiz"]
