"""Repository-wide pytest setup (it also applies to the nbval run over solutions/)."""
import os

# Notebook kernels started by nbval have no browser attached: launched training loops report progress as a
# few plain text lines (deterministic, comparable with the stored outputs) rather than as a widget.
os.environ.setdefault("COURSE_PROGRESS", "text")
