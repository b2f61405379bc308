"""Every training objective by name, behind one contract (``relsearch train`` dispatches through it).

``TRAINERS[name].train(data, options, hparams) -> TrainResult`` for each objective (see
:mod:`.options` for the three arguments and the result). ``hparams`` is the objective's config
dataclass; :meth:`Trainer.config` builds it from option values named as the CLI names them,
refusing any the objective does not have (:class:`UnknownOptions`). A new objective is one more
entry in ``TRAINERS``.

The trainer functions themselves (``train_adapter``, ``train_pu``, ...) stay callable directly,
each with its own keyword arguments; the entries here are the uniform face over them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .card import distill_card, render_model_card
from .options import RunOptions, TrainData, TrainResult


class UnknownOptions(ValueError):
    """Options the objective's config does not have (``names``: their field names)."""

    def __init__(self, names: list[str], config_cls: type):
        self.names, self.config_cls = names, config_cls
        super().__init__(f"{', '.join(names)} not supported by {config_cls.__name__}")


@dataclass(frozen=True)
class Trainer:
    """One objective: its config class, how option values map onto it, how it runs, how its card reads."""

    name: str
    summary: str
    load_config_cls: Callable[[], type]  # imports on first use: objectives pull in torch, peft, scipy
    run: Callable[[TrainData, RunOptions, object], TrainResult]
    rename: Callable[[dict], dict] = dict  # option values → config fields (CLI spellings, sentinels)
    card: Callable[..., str] = render_model_card  # (bundle, notes=...) → MODEL_CARD.md

    @property
    def config_cls(self) -> type:
        """The objective's config dataclass (its hyperparameter record)."""
        return self.load_config_cls()

    def config(self, options: dict):
        """The objective's config from option values; :class:`UnknownOptions` for ones it lacks."""
        cls = self.config_cls
        values = self.rename(dict(options))
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in values if k not in fields)
        if unknown:
            raise UnknownOptions(unknown, cls)
        if "relations" in values:
            values["relations"] = tuple(values["relations"])
        return cls(**values)

    def train(self, data: TrainData, options: RunOptions, hparams) -> TrainResult:
        """Train; ``options``' run settings that ``hparams``' class also has are applied to it. A
        bundle with test figures for relations and their ``^-1`` (``--inverse``) gets them in both
        directions and their mean as ``bundle.info["link_prediction"]`` (:mod:`.directions`)."""
        from .directions import both_directions

        result = self.run(data, options, options.applied_to(hparams))
        summary = both_directions(getattr(result.bundle, "operators", {}))
        if summary:
            result.bundle.info["link_prediction"] = summary
        return result


# ------------------------------------------------------------------------------ the objectives
def _files(data: TrainData) -> dict:
    return {"dev_files": list(data.dev), "test_files": list(data.test)}


def _rse_adapter(data: TrainData, options: RunOptions, config) -> TrainResult:
    from ..bundle import load_bundle
    from ..model import Encoder, EncoderConfig
    from .rse import train_adapter

    base = load_bundle(options.base).encoder  # a bundle's encoder (fine-tuned or not) or the model itself
    encoder = Encoder(EncoderConfig(model=base["model"], max_length=base.get("max_length")))
    return TrainResult(train_adapter(list(data.train), **_files(data), config=config, encoder=encoder,
                                     out=options.out, candidates=data.candidates))


def _rse_joint(data: TrainData, options: RunOptions, config) -> TrainResult:
    from .rse_joint import train_joint

    return TrainResult(*train_joint(list(data.train), **_files(data), config=config, base=options.base,
                                    out=options.out, candidates=data.candidates))


def _rse_tower(data: TrainData, options: RunOptions, config) -> TrainResult:
    from .tower import train_tower

    return TrainResult(train_tower(list(data.train), **_files(data), config=config, base=options.base,
                                   out=options.out, candidates=data.candidates))


def _aspect(data: TrainData, options: RunOptions, config) -> TrainResult:
    from .aspect import train_aspects

    return TrainResult(*train_aspects(list(data.train), **_files(data), config=config, base=options.base,
                                      out=options.out))


def _transition(data: TrainData, options: RunOptions, config) -> TrainResult:
    from .transition import train_transition

    return TrainResult(train_transition(list(data.train), **_files(data), config=config, base=options.base,
                                        out=options.out))


def _pu(data: TrainData, options: RunOptions, config) -> TrainResult:
    from .pu import train_pu

    return TrainResult(*train_pu(list(data.train), **_files(data), config=config, base=options.base,
                                 out=options.out))


def _distill(data: TrainData, options: RunOptions, config) -> TrainResult:
    from .distill import train_distill

    return TrainResult(*train_distill(list(data.train), teachers=list(data.teachers), **_files(data),
                                      config=config, base=options.base, out=options.out))


def _aspect_options(values: dict) -> dict:
    values["aspects"] = tuple(values.get("aspects", ()))
    return values


def _transition_options(values: dict) -> dict:
    if "lambda_" in values:  # --lambda (a Python keyword) is the config's lam
        values["lam"] = values.pop("lambda_")
    if values.get("off_temperature") == 0:  # --off-temperature 0: the plain mean
        values["off_temperature"] = None
    return values


def _config(module: str, name: str) -> Callable[[], type]:
    def load() -> type:
        from importlib import import_module

        return getattr(import_module(f"{__package__}.{module}"), name)

    return load


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer("rse", "relation operators on a frozen encoder (RSE contrastive loss)",
            _config("rse", "TrainConfig"), _rse_adapter),
    Trainer("rse-joint", "relation operators and the encoder fine-tuned together",
            _config("rse_joint", "JointConfig"), _rse_joint),
    Trainer("rse-encoder", "a relation-conditioned LoRA query encoder over frozen documents",
            _config("tower", "TowerConfig"), _rse_tower),
    Trainer("aspect", "same-label operators from a labelled corpus (AspectCSE)",
            _config("aspect", "AspectConfig"), _aspect, rename=_aspect_options),
    Trainer("transition", "a transition matrix per relation from paraphrase triples",
            _config("transition", "TransitionConfig"), _transition, rename=_transition_options),
    Trainer("pu", "a PAUSE pair classifier and its ANN operator from partly labelled pairs",
            _config("pu", "PUConfig"), _pu),
    Trainer("distill", "a student encoder distilled from several teachers",
            _config("distill", "DistillConfig"), _distill, card=distill_card),
)}


def trainer_for(objective: str, regime: str | None = None) -> Trainer:
    """The trainer of ``objective``; for ``rse`` the regime picks it (adapter, joint or encoder)."""
    if objective == "rse" and regime not in (None, "adapter"):
        return TRAINERS[f"rse-{regime}"]
    try:
        return TRAINERS[objective]
    except KeyError:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(TRAINERS)}") from None
