"""What ranks print reaches the notebook as a terminal would show it: whole lines with their
rank, from Python and from C alike (NCCL's warnings are C++ output), and a rank's
sys.stdout is a real file (faulthandler needs its fileno)."""

from __future__ import annotations

import os


def test_partial_lines_are_not_cut_into_one_line_per_piece(two, capfd):
    def dots(ctx):
        for _ in range(5):
            print(".", end="", flush=True)
        print(" done")
        print("tail without newline", end="")

    two.run(dots)
    out = capfd.readouterr().out
    assert "[rank 0] ..... done\n" in out and "[rank 1] ..... done\n" in out
    assert "[rank 0] tail without newline\n" in out
    assert out.count("[rank 0]") == 2


def test_output_written_by_c_code_reaches_the_notebook(two, capfd):
    def from_c(ctx):
        import ctypes

        os.write(1, f"fd one from {ctx.rank}\n".encode())
        os.write(2, f"fd two from {ctx.rank}\n".encode())
        ctypes.CDLL(None).printf(b"printf from rank %d\n", ctx.rank)  # C's buffered stdout

    two.run(from_c)
    captured = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] fd one from {rank}" in captured.out
        assert f"[rank {rank}] printf from rank {rank}" in captured.out
        assert f"[rank {rank}] fd two from {rank}" in captured.err


def test_sys_stdout_is_a_file_on_a_rank(two):
    def enable_faulthandler(ctx):
        import faulthandler
        import sys

        faulthandler.enable()
        return sys.stdout.fileno(), sys.stderr.fileno(), faulthandler.is_enabled()

    assert two.run(enable_faulthandler) == [(1, 2, True)] * 2


def test_a_crashing_rank_shows_its_last_words(two, capfd):
    import labkit

    def crash(ctx):
        import faulthandler
        import signal

        faulthandler.enable()
        if ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)

    try:
        two.run(crash)
    except labkit.RankError as error:
        assert error.rank == 1 and error.exitcode == -11
    err = capfd.readouterr().err
    assert "[rank 1] Fatal Python error: Segmentation fault" in err


def test_a_run_shows_at_most_max_lines_per_rank_then_says_how_many_more(two, capfd):
    from labkit.runtime.cluster.output import MAX_LINES

    def chatty(ctx):
        for i in range(MAX_LINES + 500):
            print(f"line {i}")

    two.run(chatty)
    out = capfd.readouterr().out
    for rank in (0, 1):
        assert f"[rank {rank}] line {MAX_LINES - 1}\n" in out
        assert f"[rank {rank}] line {MAX_LINES}\n" not in out
        assert f"[rank {rank}] ... and 500 more lines" in out
    two.run(lambda ctx: print("next run"))  # each run counts afresh
    assert "[rank 1] next run\n" in capfd.readouterr().out
