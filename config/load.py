"""Loading a run's config: one YAML file plus overrides, in asyncrl's names or verl's.

1. The YAML file (default: the embedded demo config) is flattened to dotted keys. A top-level
   ``defaults:`` list and ``hydra:`` section (a verl file as it is) are dropped, with a note
   (``config/read.py``).
2. The overrides apply in order: ``key=value``, ``+key=value`` and ``++key=value`` set a key
   (Hydra's add and add-or-override), ``~key`` removes one (``config/read.py``).
3. ``${...}`` interpolations are resolved by OmegaConf, as verl's, against the merged keys
   over asyncrl's defaults (``config/interpolate.py``).
4. Each key is asyncrl's own (accepted), verl's name of one (aliased), one asyncrl ignores, or
   one it refuses (``config/verl_keys.py`` says which and why); anything else is an unknown key,
   reported with the nearest valid key (``config/translate.py``).
5. verl's values are translated (``-1``: never), and the aliases that convert units are
   computed from the final values they depend on (``config/translate.py``).
6. ``RunConfig`` validates the tree (``config/validate.py``).
7. Relative file paths (data files, the reward file, model.path, output_dir...) become
   absolute against the current directory (``config/paths.py``), so the saved config means
   the same files to every process of the run.

Every problem of steps 2-6 is reported at once, each line naming the key and where it came
from: the YAML file's path, or "command line".
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from asyncrl.config.interpolate import resolve
from asyncrl.config.paths import make_paths_absolute
from asyncrl.config.read import read
from asyncrl.config.report import Loaded, LoadReport
from asyncrl.config.sections import RunConfig
from asyncrl.config.translate import translate
from asyncrl.config.validate import validate


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Loaded:
    """Steps 1-7 above: the config (or None) with every problem and what became of each key."""
    report = LoadReport()
    problems: list[str] = []
    entries = read(path, overrides or [], problems)
    entries = resolve(entries, problems)
    assigned = translate(entries, report, problems)
    cfg = validate(assigned, problems)
    if cfg is not None:
        make_paths_absolute(cfg, Path.cwd())
    return Loaded(cfg, report, problems)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load YAML (default: the embedded demo config), apply dotted overrides, validate.

    verl's key names and Hydra's override syntax are read too (config/load.py); keys with
    no effect in asyncrl are named in one warning. ConfigError lists every problem, each with
    its key and where it came from (the file, or "command line").
    """
    loaded = load(path, overrides)
    cfg = loaded.config()
    warning = loaded.report.warning()
    if warning:
        logging.getLogger("asyncrl.config").warning(warning)
    return cfg


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write the fully resolved config, so every process of a run reads the same values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
