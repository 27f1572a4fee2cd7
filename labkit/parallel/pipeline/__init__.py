"""Pipeline parallelism: a model's chain of layers cut into stages (``stages.py``), a
hand-written pipeline for reading (``naive.py``), torch.distributed.pipelining's schedules
and one step through them (``schedule.py``), and each stage's measured timeline with the
bubble it leaves (``timeline.py``)."""
