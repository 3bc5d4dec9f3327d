"""The launcher: the general engine that runs a function on a multi-process gloo or NCCL group.

Nothing in here knows about recommenders, TorchRec or FSDP; the topic modules of ``course_lib`` (planning,
sharding, training, ...) and the labs build on it. Its public names are re-exported by ``course_lib``
(``from course_lib import launch, LaunchError, Ranks``), and ``python -m course_lib.run`` is its torchrun
entry point.

Files:

========================  ===========================================================================
``launch.py``             ``launch(fn, world_size=..., backend=...)``: one-shot runs from a cell; the
                          kernel's fork server, per-rank results, streamed output, failures, timeouts
``ranks.py``              ``Ranks`` and the ``%%distributed`` / ``%dist_reset`` magics: live ranks whose
                          state persists between cells
``_zygote.py``            the preloading fork server (torch, then torchrec imported once) that forks ranks
``_rank.py``              what a rank runs: read the payload, set up the device, join the group, run,
                          report; also ``rank_device()``, a rank's ``cuda:LOCAL_RANK`` or CPU
``run.py``                the same functions under ``torchrun`` (``python -m course_lib.run MODULE:FN``)
``progress.py``           live progress from rank 0: a bar in a notebook, plain lines elsewhere
``quiet.py``              the one place where library warnings that teach nothing are filtered
``notebook.py``           ``notebook.setup()``: the first cell of every lab (quiet, seeds, plot defaults)
========================  ===========================================================================
"""
from __future__ import annotations

# Nothing is imported here: `course_lib.launcher.launch` stays the module, and `course_lib` re-exports the
# function `launch` with `LaunchError` and `Ranks`.
