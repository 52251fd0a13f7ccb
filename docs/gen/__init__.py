"""The generated parts of the docs site, so that no number or list on it is typed by hand.

A page writes a marker `<!-- gen:NAME -->`; `docs/hooks.py` replaces it with what
`GENERATORS[NAME]()` returns: a `Section` of markdown, and the figures it links to. Each module
here makes the sections of one source:

- `course`: the notebooks in notebooks/ (the nav's Course section and the home page's list);
- `concepts`: tables and figures computed by the package itself when the site is built;
- `demo`, `bench`, `gemma`, `model`, `beyond` (sweep.json, outliers.json): the stored JSON
  output of a command that was run (equarx_ref/data/*.json; `commands` lists the command behind each
  file and reruns them);
- `multihost`: the stored runs of `equarx-ref bench --hosts` (root and minutes: each file names
  its command, which `refresh` leaves alone);
- `tpu`: libtpu's records (tpu-bytes.json, tpu-schedule.json), compiled on a CPU machine;
- `layout`: the package's files, line counts and import layers, counted from its files (the
  contributing page);
- `readme`: the README's headline, made from the same JSON (`python docs/hooks.py readme`).
"""

from __future__ import annotations

from . import bench, beyond, concepts, course, demo, gemma, layout, model, multihost, tpu
from .common import Section, install

__all__ = ["GENERATORS", "Section"]

GENERATORS = {
    "install": install,
    "layout": layout.files,
    "layers": layout.layers,
    "course": course.course_list,
    "formats": concepts.formats_table,
    "schedules": concepts.schedules_figure,
    "error-model": concepts.error_model_table,
    "wire-bytes": concepts.wire_bytes_table,
    "time-model": concepts.time_model_table,
    "headline": demo.headline,
    "demo": demo.results,
    "bench": bench.results,
    "gemma-headline": gemma.headline,
    "gemma": gemma.results,
    "model": model.results,
    "multihost": multihost.results,
    "sweep": beyond.sweep_results,
    "outliers": beyond.outliers_results,
    "tpu-bytes": tpu.results,
    "tpu-schedule": tpu.schedule_results,
}
