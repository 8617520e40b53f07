"""Streams, events and CUDA graphs: Python conveniences over ``cudalab._core``.

``Stream``, ``Event``, ``CUDAGraph``, ``current_stream`` and ``default_stream``
live in the C extension; this module adds the ``graph`` capture context and
``stream()``, both shaped like their ``torch.cuda`` namesakes.
"""

from __future__ import annotations

from typing import Optional

from . import _core
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
    ``get()`` or ``asarray()``, ``empty_cache()``, ``Stream.synchronize()``,
    ``Event.synchronize()``, ...) is refused with :class:`CudalabError`
    before CUDA is asked, so the capture itself stays valid: caught inside
    the block, the capture goes on. An error that leaves the block ends the
    capture and discards it; the stream stays usable.

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
        # Without a device, the error names graph(), not Stream().
        _core._parse_device(None, "graph")
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
                        "cudalab.graph: the CUDA graph capture was ended and discarded "
                        "because an error left the `with` block"
                    )
        finally:
            side.__exit__(None, None, None)
        return False


class stream:
    """Make ``s`` the current stream inside the block; a no-op for None.

    stream(s)

    ``with cudalab.stream(s):`` is ``with s:``, shaped like ``torch.cuda.stream``.

    Parameters
    ----------
    s : Stream or None

    Raises
    ------
    TypeError
        If ``s`` is neither a Stream nor None.
    """

    def __init__(self, s: Optional[Stream]) -> None:
        if s is not None and not isinstance(s, Stream):
            raise TypeError(
                f"stream() argument 's': expected a Stream or None, got {type(s).__name__}"
            )
        self.stream = s

    def __enter__(self) -> Optional[Stream]:
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.stream is not None:
            self.stream.__exit__(None, None, None)
        return False
