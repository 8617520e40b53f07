"""Streams, events and CUDA graphs: Python conveniences over ``cudalab._core``.

``Stream``, ``Event``, ``CUDAGraph``, ``current_stream`` and ``default_stream``
live in the C extension; this module adds the ``graph`` capture context and
``stream()``, both shaped like their ``torch.cuda`` namesakes.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from ._core import CUDAGraph, Stream, current_stream

__all__ = ["graph", "stream"]


class graph:
    """Capture the work issued inside the block into ``cuda_graph``.

    graph(cuda_graph, stream=None)

    Capture runs on a side stream (a fresh ``Stream()`` unless ``stream`` is
    given) that first waits for the work already enqueued on the current
    stream, and is the thread's current stream inside the block. Allocations
    made inside come from the pool as graph memory: arrays created in the block
    stay valid afterwards and hold the results of each ``cuda_graph.replay()``.

    An operation that cannot be captured (``synchronize()``, a pageable
    ``get()``, ...) raises; the capture is then ended and discarded, the
    stream stays usable, and the error propagates.

    Parameters
    ----------
    cuda_graph : CUDAGraph
        Receives the captured work; must not hold a graph already (``reset()``).
    stream : Stream, optional
        The capture stream; not the legacy default stream.

    Examples
    --------
    >>> g = cudalab.CUDAGraph()
    >>> with cudalab.graph(g):
    ...     y = x * 2 + 1
    >>> g.replay()          # recomputes y from x's current values
    """

    def __init__(self, cuda_graph: CUDAGraph, stream: Optional[Stream] = None) -> None:
        if not isinstance(cuda_graph, CUDAGraph):
            raise TypeError(
                "graph() argument 'cuda_graph': expected a CUDAGraph, got "
                f"{type(cuda_graph).__name__}"
            )
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(
                f"graph() argument 'stream': expected a Stream, got {type(stream).__name__}"
            )
        if stream is not None and stream.cuda_stream == 0:
            raise ValueError(
                "graph() argument 'stream': cannot capture on the legacy default stream; "
                "use a Stream()"
            )
        self.cuda_graph = cuda_graph
        self.stream = stream

    def __enter__(self) -> CUDAGraph:
        side = self.stream if self.stream is not None else Stream()
        side.wait_stream(current_stream(side.device))
        side.__enter__()
        try:
            self.cuda_graph.capture_begin(side)
        except BaseException:
            side.__exit__(None, None, None)
            raise
        self._side = side
        return self.cuda_graph

    def __exit__(self, exc_type, exc, tb) -> bool:
        side = self._side
        try:
            if exc_type is None:
                self.cuda_graph.capture_end()
            else:
                self.cuda_graph._abort_capture()
                if exc is not None and hasattr(exc, "add_note"):
                    exc.add_note(
                        "cudalab.graph: the CUDA graph capture was ended and discarded; "
                        "this operation cannot be captured (no synchronization, pageable "
                        "host copies or legacy-stream work while capturing)"
                    )
        finally:
            side.__exit__(None, None, None)
        return False


@contextlib.contextmanager
def stream(s: Optional[Stream]) -> Iterator[Optional[Stream]]:
    """``with cudalab.stream(s):`` — like ``with s:``, and a no-op for None."""
    if s is None:
        yield None
        return
    if not isinstance(s, Stream):
        raise TypeError(f"stream() argument 's': expected a Stream or None, got {type(s).__name__}")
    with s:
        yield s
