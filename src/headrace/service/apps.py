"""What a command runs against: the app named `module:attribute`, and the store URL.

Every command that uses a store takes it the same way: `--db URL` (or `HEADRACE_URL`) names the
store, `--app MODULE:ATTR` (or `HEADRACE_APP`) names the app, and a store given with `--db`
overrides the app's own URL.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from headrace.policy.errors import ConfigError
from headrace.runtime.app import App
from headrace.service import extras
from headrace.service.failures import WrongInput, use_store
from headrace.store.sqlite import path_from_url
from headrace.store.urls import SQLITE_SCHEME


def store_url(db: str) -> str:
    """A store URL as it is, or a plain file path as the URL of an SQLite store."""
    if "://" in db:
        return db
    return f"sqlite:///{Path(db).resolve()}"


def load_app(target: str) -> App:
    """`module:attribute` (attribute defaults to `app`); a callable attribute that needs no
    arguments is called to make the app. The current directory is on the import path, as it is
    for `uvicorn module:app`."""
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "app"
    if not module_name:
        raise ConfigError(f"app {target!r}: expected MODULE:ATTRIBUTE, e.g. myapp:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise _cannot_import(target, module_name, error) from None
    if not hasattr(module, attribute):
        raise ConfigError(f"app {target!r}: module {module_name!r} has no attribute {attribute!r}")
    found = getattr(module, attribute)
    if _is_factory(found):
        found = found()
    if not isinstance(found, App):
        raise ConfigError(
            f"app {target!r}: {type(found).__name__} is not a headrace App (nor makes one)"
        )
    return found


def _cannot_import(target: str, module_name: str, error: ImportError) -> Exception:
    """Why the app's module cannot be imported: one of headrace's own modules whose extra is not
    installed says which extra, anything else which module."""
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    extra = extras.extra_of(missing) if missing and module_name.startswith("headrace.") else None
    if missing and extra:
        return extras.needs(f"app {target!r}", extra, (missing,))
    return ConfigError(
        f"app {target!r}: cannot import {module_name!r} ({error}); check the module name "
        "and run from the directory that holds it"
    )


def _is_factory(found: object) -> bool:
    """A callable that needs no arguments: called to make the app."""
    if isinstance(found, App) or not callable(found):
        return False
    try:
        inspect.signature(found).bind()
    except (TypeError, ValueError):
        return False
    return True


def resolve(db: str | None, target: str | None) -> App:
    """The app a command runs against: the one at `target` (its store replaced by `db` when
    given), or a bare app over the store `db`. At least one of them must be given."""
    if target:
        app = load_app(target)
    elif db:
        app = App(store_url(db))
    else:
        raise WrongInput(
            "give the store with --db URL (or HEADRACE_URL), or the app with --app MODULE:ATTR "
            "(or HEADRACE_APP)"
        )
    if db:
        app.url = store_url(db)
    use_store(app.url)
    return app


def require_existing(app: App) -> App:
    """`app`, refused when its store is an SQLite file that does not exist: a command that only
    reads or changes tasks must not create an empty store where a path was mistyped."""
    if urlsplit(app.url).scheme == SQLITE_SCHEME:
        path = path_from_url(app.url).resolve()
        if not path.exists():
            raise WrongInput(
                f"no store at {path}: check the path (a worker or `headrace submit` creates "
                "the file)"
            )
    return app
