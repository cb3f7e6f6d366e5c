"""The model registry: versions by number or alias, and the gate's version tags and descriptions.
Promotion (an alias moved under a lock, read back) is :mod:`consistency_gate.mlops.promotion`.

Nothing here computes a metric or loads a model (:mod:`consistency_gate.mlops.scoring` does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from consistency_gate.errors import ModelError, TrackingError, redact_credentials
from consistency_gate.mlops.store import looks_unreachable, mlflow_tracking_uri, refusal

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

CLASSES_TAG = "consistency_gate.classes"
OUTPUTS_TAG = "consistency_gate.outputs"  # "logits" or "probabilities": whether scores are softmaxed
TAG_VERDICT = "consistency_gate.verdict"
TAG_KIND = "consistency_gate.kind"
TAG_RUN_ID = "consistency_gate.run_id"
TAG_REPLACES = "consistency_gate.replaces"
TAG_ROLLED_BACK = "consistency_gate.rolled_back_to"  # on a version rolled back: the version restored in its place
TAG_MODELS = "consistency_gate.models"  # the models a registered repair carries, its own repairs' included
SIGNATURE = "consistency-gate run "  # how the gate's paragraph of a version's description ends (and its run id)
OLD_PREFIX = "consistency-gate: "  # how it started before it led with the verdict
MOVE_SIGNATURE = "consistency-gate move"  # how an alias move's paragraph ends (and its run id)
MAX_VERSION = 2**31 - 1  # the registry stores version numbers as 32-bit integers


@dataclass
class ModelRef:
    """One registered model version."""

    name: str
    version: str
    alias: str | None = None
    run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    model_id: str | None = None  # the MLflow 3 logged model behind the version (its page shows linked metrics)
    source: str | None = None  # a model that is not a registered version: its URI (``models:/m-...``)
    local: str | None = None  # the folder its artifacts were downloaded to, once loaded (mlops/scoring.py)

    @property
    def uri(self) -> str:
        """``models:/NAME/VERSION`` (or the unregistered model's ``source`` URI)."""
        return self.source or f"models:/{self.name}/{self.version}"

    @property
    def artifacts(self) -> str:
        """Where to load the model from: the folder it was downloaded to, else its URI."""
        return self.local or self.uri

    def to_dict(self) -> dict:
        """As in the JSON report."""
        return {"name": self.name, "version": self.version, "alias": self.alias, "uri": self.uri}


def resolve_version(client: MlflowClient, name: str, spec: str | None) -> ModelRef:
    """A version from ``'3'``, ``'@alias'`` or None (the latest version). ModelError if absent.

    Example::

        client = MlflowClient("sqlite:///mlflow.db")
        resolve_version(client, "fraud-clf", "@champion").version
        # '3'
    """
    from mlflow.exceptions import MlflowException

    try:
        if spec is None:
            versions = client.search_model_versions(f"name='{name}'")
            if not versions:
                _require_model(client, name)
                raise ModelError(f"model '{name}' has no versions; register one first")
            mv = max(versions, key=lambda v: int(v.version))
            alias = None
        elif spec.startswith("@"):
            alias = spec[1:]
            mv = client.get_model_version_by_alias(name, alias)
        else:
            alias = None
            if not is_number(spec):
                raise ModelError(f"version '{spec}' of model '{name}': expected a number or @alias")
            if int(spec) > MAX_VERSION:  # a server answers 500 for a number its database cannot hold
                raise ModelError(f"model '{name}': version '{spec}' not found; {registered_versions(client, name)}")
            mv = client.get_model_version(name, spec)
    except MlflowException as exc:
        _require_model(client, name)  # the model itself missing is the first thing to say
        what = f"alias '@{spec[1:]}' is not set" if spec and spec.startswith("@") else f"version '{spec}' not found"
        _reraise(exc, f"model '{name}': {what}; {registered_versions(client, name)}")
    return ModelRef(name, str(mv.version), alias, mv.run_id, dict(mv.tags or {}), logged_model_id(mv))


def _require_model(client: MlflowClient, name: str) -> None:
    """ModelError (exit 4) when no registered model is named ``name`` (asked only once a look-up failed: a gate
    that finds its versions pays no request for it)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        store = redact_credentials(mlflow_tracking_uri())
        _reraise(exc, f"registered model '{name}' not found in {store}; check --model and --tracking-uri")


def is_number(text: str) -> bool:
    """Whether ``text`` is a version number or pid in ASCII digits (``'²'.isdigit()`` is True, and
    ``int('²')`` fails).

    >>> is_number("12"), is_number("²"), is_number("")
    (True, False, False)
    """
    return text.isascii() and text.isdigit()


def version_numbers(client: MlflowClient, name: str) -> list[int]:
    """The registered model's version numbers, in order.

    Example::

        version_numbers(client, "fraud-clf")
        # [1, 2, 3]
    """
    return sorted(int(v.version) for v in _search_versions(client, name))


def possible_baselines(client: MlflowClient, name: str, before: int) -> list[int]:
    """The versions before ``before`` that may be in production, in order: all but those a gate
    failed (a failed first generation never became the baseline, so its successor is a first
    generation too).

    Example::

        possible_baselines(client, "fraud-clf", 3)  # v1 failed its gate
        # [2]
    """
    versions = _search_versions(client, name)
    return sorted(int(v.version) for v in versions if int(v.version) < before and v.tags.get(TAG_VERDICT) != "failed")


def _search_versions(client: MlflowClient, name: str) -> list:
    from mlflow.exceptions import MlflowException

    try:
        return list(client.search_model_versions(f"name='{name}'"))
    except MlflowException as exc:
        _reraise(exc, f"model '{name}': cannot list its versions")


def registered_versions(client: MlflowClient, name: str) -> str:
    """What a registered model holds, for an error message: its versions and aliases.

    Example::

        registered_versions(client, "fraud-clf")
        # 'it has versions 1, 2, 3 and the aliases @champion (v2)'
    """
    try:
        versions = version_numbers(client, name)
        aliases = client.get_registered_model(name).aliases or {}
    except Exception:  # noqa: BLE001 - only a hint: the error it joins is the one to report
        return "see its versions in the MLflow UI (Models)"
    shown = ", ".join(map(str, versions[-10:])) + (f" (and {len(versions) - 10} earlier)" if len(versions) > 10 else "")
    held = ", ".join(f"@{a} (v{v})" for a, v in sorted(aliases.items())) or "none"
    return f"it has versions {shown or 'none'} and the aliases {held}"


def ref_from_uri(client: MlflowClient, uri: str) -> ModelRef:
    """The model a ``models:/NAME/VERSION`` or ``models:/NAME@alias`` URI names, with its tags; any
    other URI (a logged model ``models:/m-...``, ``runs:/...``) as an unregistered model. ModelError
    if a registered name, version or alias is absent.

    Example::

        ref_from_uri(client, "models:/fraud-clf@champion").version
        # '3'
    """
    name, at, alias = uri.removeprefix("models:/").partition("@")
    if uri.startswith("models:/") and at and name:
        return resolve_version(client, name, "@" + alias)
    name, slash, version = uri.removeprefix("models:/").rpartition("/")
    if uri.startswith("models:/") and slash and name and is_number(version):
        return resolve_version(client, name, version)
    return ModelRef(uri, "", source=uri)


def logged_model_ref(client: MlflowClient, model_id: str) -> ModelRef:
    """The registered version of an MLflow 3 logged model (with its version tags), or the logged
    model itself (with its own tags) when no version was registered from it.

    Example::

        logged_model_ref(client, "m-1f2e3d").uri
        # 'models:/fraud-clf/4'
    """
    logged = client.get_logged_model(model_id)
    if logged.source_run_id:
        for mv in client.search_model_versions(f"run_id = '{logged.source_run_id}'"):
            if logged_model_id(mv) == model_id:
                return ModelRef(mv.name, str(mv.version), None, mv.run_id, dict(mv.tags or {}), model_id)
    return ModelRef(
        logged.name, "", None, logged.source_run_id, dict(logged.tags or {}), model_id, f"models:/{model_id}"
    )


def logged_model_id(mv: ModelVersion) -> str | None:
    """The id of the MLflow 3 logged model a version was registered from (``m-...``), or None
    (a version registered from a run's artifact path has none).

    >>> from mlflow.entities.model_registry import ModelVersion
    >>> logged_model_id(ModelVersion("clf", "3", 0, source="models:/m-1f2e3d"))
    'm-1f2e3d'
    """
    if getattr(mv, "model_id", None):
        return mv.model_id
    source = mv.source or ""
    return source.removeprefix("models:/") if source.startswith("models:/m-") else None


def register_version(model_uri: str, name: str) -> str:
    """Register a logged model as a new version of ``name`` (created if new); returns the version.
    MLflow's own lines ("Successfully registered model ...") are not printed: the caller says
    what happened.

    Example::

        register_version(model_info.model_uri, "digits-cnn")
        # '3'
    """
    import mlflow
    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

    was = MLFLOW_LOGGING_STREAM.enabled
    MLFLOW_LOGGING_STREAM.enabled = False
    try:
        return str(mlflow.register_model(model_uri, name).version)
    finally:
        MLFLOW_LOGGING_STREAM.enabled = was


def tag_version(
    client: MlflowClient,
    ref: ModelRef,
    verdict: str,
    kind: str,
    run_id: str,
    replaces: str | None = None,
    models: int | None = None,
) -> None:
    """Tag a gated version with its verdict, its kind (single; ensemble or distilled where remediation
    built it) and the gate run; a version registered in place of a failed candidate also names the
    version it replaces and the ``models`` it carries (:func:`models_carried` reads them back).

    Example::

        tag_version(client, ModelRef("fraud-clf", "4"), "passed", "single", run_id)
    """
    tags = {TAG_VERDICT: verdict, TAG_KIND: kind, TAG_RUN_ID: run_id}
    if replaces is not None:
        tags[TAG_REPLACES] = replaces
    if models is not None:
        tags[TAG_MODELS] = str(models)
    for key, value in tags.items():
        client.set_model_version_tag(ref.name, ref.version, key, value)


def models_carried(client: MlflowClient, name: str, version: str) -> int:
    """How many models version ``version`` of ``name`` carries: its ``consistency_gate.models`` tag, which
    the gate sets on every repair it registers (a repair of a repair counts every model inside); 1 for a
    version without it (a model a team trained and registered).

    Example::

        models_carried(client, "fraud-clf", "7")
        # 3: a blend of v5 (itself a blend of v3 and v4) and v6
    """
    value = client.get_model_version(name, version).tags.get(TAG_MODELS, "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def describe_version(client: MlflowClient, ref: ModelRef, text: str, run_id: str) -> None:
    """Lead the version's description with ``text``, the verdict and versions first (the registry's versions
    table shows a description's first characters), signed ``consistency-gate run RUN_ID.``: one paragraph that
    an earlier gate's paragraph is replaced by; an alias move's paragraph and what anyone else wrote stay below.

    Example::

        describe_version(client, ModelRef("fraud-clf", "4"), "PASSED v4 vs v3 (@champion) on eval.csv ...", run_id)
    """
    own = client.get_model_version(ref.name, ref.version).description or ""
    client.update_model_version(ref.name, ref.version, description=with_verdict(own, f"{text} {SIGNATURE}{run_id}."))


def describe_move(client: MlflowClient, ref: ModelRef, text: str, run_id: str | None) -> None:
    """Say a move of the alias on the version (rolled back, restored, reverted, authorized): a paragraph after the
    gate's verdict, which stays first, in place of an earlier move's, signed ``consistency-gate move run RUN_ID.``
    (``consistency-gate move.`` when no run made it: a move the guard saw overwritten).

    Example::

        describe_move(client, ModelRef("fraud-clf", "4"), "ROLLED BACK v4 to v3: complaints.", run_id)
    """
    own = client.get_model_version(ref.name, ref.version).description or ""
    signed = f"{text} {MOVE_SIGNATURE}" + (f" run {run_id}." if run_id else ".")
    client.update_model_version(ref.name, ref.version, description=with_move(own, signed))


def with_verdict(description: str, paragraph: str) -> str:
    r"""``description`` led by a gate's ``paragraph`` in place of an earlier gate's; a move's paragraph and what
    anyone else wrote follow.

    >>> with_verdict("ROLLED BACK v4. consistency-gate move run r2.\n\nMine.", "FAILED v4. consistency-gate run r3.")
    'FAILED v4. consistency-gate run r3.\n\nROLLED BACK v4. consistency-gate move run r2.\n\nMine.'
    """
    first, _, rest = description.partition("\n\n")
    kept = rest if ours(first) else description
    return f"{paragraph}\n\n{kept}".strip()


def with_move(description: str, paragraph: str) -> str:
    r"""``description`` with a move's ``paragraph`` after the gate's verdict (never in its place), in place of an
    earlier move's.

    >>> with_move("PASSED v4. consistency-gate run r1.\n\nMine.", "ROLLED BACK v4. consistency-gate move run r2.")
    'PASSED v4. consistency-gate run r1.\n\nROLLED BACK v4. consistency-gate move run r2.\n\nMine.'
    >>> with_move(_, "RESTORED v4. consistency-gate move run r5.").split("\n\n")[1]
    'RESTORED v4. consistency-gate move run r5.'
    """
    paragraphs = [p for p in description.split("\n\n") if p]
    verdict = paragraphs[:1] if paragraphs and ours(paragraphs[0]) else []
    rest = paragraphs[len(verdict) :]
    if rest and moved(rest[0]):
        rest = rest[1:]
    return "\n\n".join([*verdict, paragraph, *rest])


def lead_description(client: MlflowClient, ref: ModelRef, sentence: str) -> None:
    """Lead the gate's paragraph of the version's description with ``sentence`` (what happened after the
    verdict was written: a promotion whose outcome is unknown).

    Example::

        lead_description(client, ModelRef("fraud-clf", "4"), "PROMOTION UNKNOWN: read @champion before deploying.")
    """
    own = client.get_model_version(ref.name, ref.version).description or ""
    first, _, rest = own.partition("\n\n")
    if ours(first) and not first.startswith(sentence):
        text = f"{sentence} {first}\n\n{rest}".strip()
        client.update_model_version(ref.name, ref.version, description=text)


def moved(paragraph: str) -> bool:
    """Whether a description's paragraph is an alias move's (:func:`describe_move`).

    >>> moved("REVERTED: @champion was moved to v7 ... consistency-gate move run 3f2a."), moved("Mine.")
    (True, False)
    """
    return re.search(rf"{MOVE_SIGNATURE}( run \w+)?\.$", paragraph) is not None


def ours(paragraph: str) -> bool:
    """Whether a description's first paragraph is the gate's: signed, or in the older form led by
    ``consistency-gate: ``.

    >>> ours("PASSED v2 vs v1 on eval.csv (150 samples): 1 rule held. consistency-gate run 3f2a."), ours("Mine.")
    (True, False)
    """
    return paragraph.startswith(OLD_PREFIX) or re.search(rf"{SIGNATURE}\w+\.$", paragraph) is not None


def alias_exists(client: MlflowClient, name: str, alias: str) -> bool:
    """Whether ``name@alias`` is set (ModelError if the model does not exist).

    Example::

        alias_exists(client, "fraud-clf", "champion")
        # True
    """
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version_by_alias(name, alias)
        return True
    except MlflowException as exc:
        if is_not_found(exc):
            return False
        _reraise(exc, f"model '{name}': cannot read its alias @{alias}")


def is_not_found(exc: Exception) -> bool:
    """Whether MLflow's exception says the thing asked for does not exist."""
    return getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND")


def _reraise(exc: Exception, message: str) -> NoReturn:
    refused = refusal(exc, mlflow_tracking_uri())
    if refused is not None:
        raise refused from None
    if is_not_found(exc):
        raise ModelError(message) from None
    if looks_unreachable(exc):
        raise TrackingError(f"tracking server unreachable: {exc}") from None
    raise ModelError(f"{message} ({exc})") from None


# ---------------------------------------------------------------- promotion
