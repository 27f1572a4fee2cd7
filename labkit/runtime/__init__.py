"""The runtime: ranks started from a cell (``cluster/``), their collectives counted and
timed (``comm/``), each rank's device memory tracked and capped (``memory/``), and the cost
formulas the suite shares (``costs.py``). Imports nothing else of labkit.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
