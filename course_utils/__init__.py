"""The training-ledger course kit: real training kernels behind the lesson notebooks.

Modules mirror the course's chapters: ``data``, ``augment``, ``models``, ``ledger``, ``train``,
``evaluate``, then ``objectives``, ``memory``, ``distributed``, ``checkpoint``, ``exercises``.
Import what a lesson needs, e.g. ``from course_utils.ledger import measure``.
"""

__version__ = "0.1.0"
