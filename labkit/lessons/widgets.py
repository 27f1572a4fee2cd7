"""Widgets for the notebooks: each renders a static Figure too, for headless runs."""

from labkit.lessons.data_parallel.widgets import ScalingExplorer, scaling_explorer
from labkit.lessons.memory_wall.widgets import MemoryExplorer, memory_explorer
from labkit.lessons.pipeline.widgets import PipelineExplorer, pipeline_explorer
from labkit.lessons.recommender.widgets import RecommenderExplorer, recommender_explorer
from labkit.lessons.sharding.widgets import ShardingExplorer, sharding_explorer
from labkit.lessons.show.quiz import load_quiz, quiz_html, quiz_widget, show_quiz
from labkit.lessons.show.source import show_source
from labkit.lessons.tensor_parallel.widgets import TensorParallelExplorer, tp_explorer

__all__ = ["MemoryExplorer", "PipelineExplorer", "ScalingExplorer", "ShardingExplorer",
           "TensorParallelExplorer", "load_quiz", "memory_explorer", "pipeline_explorer",
           "quiz_html", "quiz_widget", "scaling_explorer", "sharding_explorer", "show_quiz",
           "show_source", "tp_explorer"]
__all__ += ["RecommenderExplorer", "recommender_explorer"]
from labkit.lessons.layouts.widgets import LayoutExplorer, layout_explorer  # noqa: E402

__all__ += ["LayoutExplorer", "layout_explorer"]
from labkit.lessons.long_context.widgets import SequenceExplorer  # noqa: E402

__all__ += ["SequenceExplorer"]
from labkit.lessons.memory_wall.levers_widget import lever_picker  # noqa: E402

__all__ += ["lever_picker"]
from labkit.lessons.data_parallel.overlap_widget import bucket_explorer  # noqa: E402

__all__ += ["bucket_explorer"]
from labkit.lessons.long_context.capacity_widget import capacity_slider  # noqa: E402

__all__ += ["capacity_slider"]
