"""A Jupyter kernel client that waits for a kernel's messages in one-second polls.

Why it exists: nbclient waits for a cell's reply with one poll of the ZMQ socket that lasts the
cell's whole time limit (forever where there is none, as when grading). ZMQ signals a socket
through an edge-triggered file descriptor, and now and then the wake-up is missed (nbclient#312,
"when cell contains ipywidget, execute cell will sometimes block"; seen in this kit's suite: lesson
01's widget cell replied, and the client read the reply 600 s later, at its time limit): the reply
sits in the socket while the client sleeps. pyzmq looks at the socket's events each time a poll
starts, so a wait made of one-second polls reads a waiting message within a second, and gives up
at the same deadline as before. Everything else is jupyter_client's, unchanged.

Wherever the kit executes a notebook it passes ``CLIENT_OPTIONS`` (this kernel manager):
``NotebookClient(nb, **CLIENT_OPTIONS, ...)``, or papermill's ``execute_notebook(...,
**CLIENT_OPTIONS)``, which passes them on to nbclient.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from queue import Empty
from typing import Any

from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type, default

POLL_SECONDS = 1.0


async def wait_in_slices(poll: Callable[[float], Awaitable[Any]], timeout: float | None,
                         slice_seconds: float = POLL_SECONDS) -> Any:
    """``await poll(t)`` (which returns a message or raises ``queue.Empty`` after ``t`` seconds)
    again and again, each at most ``slice_seconds``, until it returns or ``timeout`` seconds have
    passed in all (``None`` or negative: no limit, as for ZMQ's poll); then ``Empty``, as one long
    poll would raise."""
    deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
    while True:
        left = slice_seconds if deadline is None else \
            min(slice_seconds, max(0.0, deadline - time.monotonic()))
        try:
            return await poll(left)
        except Empty:
            if deadline is not None and deadline - time.monotonic() < 1e-3:  # ZMQ counts in ms
                raise


class SlicedPollChannel(AsyncZMQSocketChannel):
    """A channel whose ``get_msg(timeout)`` is ``wait_in_slices`` of the usual one."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await wait_in_slices(lambda t: AsyncZMQSocketChannel.get_msg(self, timeout=t),
                                    timeout)


class SlicedPollKernelClient(AsyncKernelClient):
    """The async kernel client with the two channels nbclient waits on made ``SlicedPollChannel``."""
    shell_channel_class = Type(SlicedPollChannel)
    iopub_channel_class = Type(SlicedPollChannel)


class SlicedPollKernelManager(AsyncKernelManager):
    """The async kernel manager (nbclient's and papermill's default) whose clients are
    ``SlicedPollKernelClient``."""

    @default("client_factory")
    def _sliced_poll_client(self) -> type:
        return SlicedPollKernelClient


CLIENT_OPTIONS = {"kernel_manager_class": SlicedPollKernelManager}
