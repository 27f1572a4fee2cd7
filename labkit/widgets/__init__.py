"""Widgets for the notebooks: each renders a static Figure too, for headless runs."""

from labkit.widgets.memory import MemoryExplorer, memory_explorer
from labkit.widgets.pipeline import PipelineExplorer, pipeline_explorer
from labkit.widgets.quiz import load_quiz, quiz_html, quiz_widget, show_quiz
from labkit.widgets.recommender import RecommenderExplorer, recommender_explorer
from labkit.widgets.scaling import ScalingExplorer, scaling_explorer
from labkit.widgets.sharding import ShardingExplorer, sharding_explorer
from labkit.widgets.source import show_source
from labkit.widgets.tensor_parallel import TensorParallelExplorer, tp_explorer

__all__ = ["MemoryExplorer", "PipelineExplorer", "ScalingExplorer", "ShardingExplorer",
           "TensorParallelExplorer", "load_quiz", "memory_explorer", "pipeline_explorer",
           "quiz_html", "quiz_widget", "scaling_explorer", "sharding_explorer", "show_quiz",
           "show_source", "tp_explorer"]
__all__ += ["RecommenderExplorer", "recommender_explorer"]
from labkit.widgets.layout import LayoutExplorer, layout_explorer  # noqa: E402

__all__ += ["LayoutExplorer", "layout_explorer"]
from labkit.widgets.long_context import SequenceExplorer  # noqa: E402

__all__ += ["SequenceExplorer"]
from labkit.widgets.levers import lever_picker  # noqa: E402

__all__ += ["lever_picker"]
from labkit.widgets.overlap import bucket_explorer  # noqa: E402

__all__ += ["bucket_explorer"]
from labkit.widgets.capacity import capacity_slider  # noqa: E402

__all__ += ["capacity_slider"]
