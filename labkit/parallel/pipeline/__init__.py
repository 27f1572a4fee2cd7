"""Pipeline parallelism: a model's chain of layers cut into stages (``stages.py``), GPipe and
1F1B written by hand for reading (``naive.py``) over send and recv between neighbouring
stages (``p2p.py``), torch.distributed.pipelining's schedules and one step through either
(``schedule.py``), and each stage's measured timeline with the bubble it leaves
(``timeline.py``)."""
