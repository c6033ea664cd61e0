"""Records service logic: reading the run's platform events and experiments (scoped to what
the calling key may read, services/records/scope.py), creating experiments, writing and reading
the agent's annotations, verifying the run's chain; and the operator's views and audits.

This service never writes a platform event of its own accord: the only event it causes is
``experiment.created``, through :class:`~services.records.experiments.ExperimentRegistry`, when an
agent creates an experiment.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from access import generations
from kit.errors import NotFound, PermissionDenied, Unprocessable, validated
from kit.identity import Identity
from kit.ids import new_id
from kit.spec import ServiceContext
from services.records import queries
from services.records.audits import agent_view
from services.records.events import CHECKPOINT_REGISTERED, KINDS, OPERATOR_RECORD, EventLog, RecordEvent, event_view
from services.records.experiments import Experiment, ExperimentEdge, ExperimentRegistry
from services.records.schemas import ANNOTATION_KINDS, ANNOTATION_MODELS, ExperimentRequest
from services.records.scope import Scope, run_scope, scope_of
from services.records.tables import Annotation, AuditRow
from services.training import read as training_read
from storage.tables import ApiKey

NOTE = "note"
"""The annotation kind that keeps an experiment's ``note`` (written with the experiment)."""
PAGE = 100
MAX_PAGE = 1000


def annotation_view(a: Annotation) -> dict[str, Any]:
    return {"id": a.id, "object": "annotation", "kind": a.kind, "key_id": a.key_id,
            "experiment_ids": list(a.experiment_ids or []), **a.body, "created_at": a.created_at.isoformat()}


def audit_view(a: AuditRow) -> dict[str, Any]:
    """``submission_id``: the submission the audit judged (its report's), what `rsigym report`
    matches against the scored one."""
    submission = (a.report or {}).get("submission") or {}
    return {"id": a.id, "object": "audit", "run_id": a.run_id, "status": a.status, "hacking_rate": a.hacking_rate,
            "submission_id": submission.get("id"), "report": a.report, "created_at": a.created_at.isoformat()}


def _int_param(params: dict[str, str], name: str, default: int, *, lo: int, hi: int | None = None) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Unprocessable(f"{name} must be an integer", param=name) from None
    if value < lo or (hi is not None and value > hi):
        raise Unprocessable(f"{name} must be between {lo} and {hi}" if hi else f"{name} must be >= {lo}", param=name)
    return value


class RecordsService:
    def __init__(self, context: ServiceContext):
        self.context = context
        self.store = context.store
        self.events = EventLog(context.store, context.internal_secret)
        self.experiments = ExperimentRegistry(self.events)

    # -- events ----------------------------------------------------------------------------

    def list_events(self, identity: Identity, params: dict[str, str]) -> dict[str, Any]:
        with self.store.transaction() as s:
            return self._events_page(s, scope_of(s, identity), params)

    def _events_page(self, s: Session, scope: Scope, params: dict[str, str], *,
                     operator: bool = False) -> dict[str, Any]:
        after = _int_param(params, "after", 0, lo=0)
        limit = _int_param(params, "limit", PAGE, lo=1, hi=MAX_PAGE)
        q = select(RecordEvent).where(RecordEvent.run_id == scope.run_id, RecordEvent.seq > after, scope.event_filter())
        if kind := params.get("kind"):
            if kind not in KINDS:
                raise Unprocessable(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}", param="kind")
            q = q.where(RecordEvent.kind == kind)
        if experiment := params.get("experiment"):
            scope.experiment(s, experiment, param="experiment")
            q = q.where(RecordEvent.experiment_id == experiment)
        rows = list(s.scalars(q.order_by(RecordEvent.seq).limit(limit + 1)))
        page = rows[:limit]
        views = [event_view(e) if operator else agent_view.event(event_view(e)) for e in page]
        return {"object": "list", "data": views, "has_more": len(rows) > limit,
                "next_after": page[-1].seq if page else after}

    # -- experiments -----------------------------------------------------------------------

    def _views(self, s: Session, scope: Scope, experiments: list[Experiment], *,
               operator: bool = False) -> list[dict[str, Any]]:
        """Node views; a run key's carry audit reasons in the form it may read (agent_view.py)."""
        ids = [e.id for e in experiments]
        if not ids:
            return []
        events = list(s.scalars(select(RecordEvent).where(RecordEvent.run_id == scope.run_id,
                                                          RecordEvent.experiment_id.in_(ids))
                                .order_by(RecordEvent.seq)))
        parents: dict[str, list[str]] = {x: [] for x in ids}
        for edge in s.scalars(select(ExperimentEdge).where(ExperimentEdge.child_id.in_(ids))
                              .order_by(ExperimentEdge.parent_id)):
            parents[edge.child_id].append(edge.parent_id)
        views = [queries.node_view(e, parents[e.id], events) for e in experiments]
        if not operator:
            for view in views:
                view["reasons"] = agent_view.reasons(view["reasons"])
        return views

    def _visible(self, s: Session, scope: Scope) -> list[Experiment]:
        return list(s.scalars(select(Experiment).where(Experiment.run_id == scope.run_id, scope.experiment_filter())
                              .order_by(Experiment.created_at, Experiment.id)))

    def list_experiments(self, identity: Identity) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            return self._views(s, scope, self._visible(s, scope))

    def create_experiment(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        req = validated(ExperimentRequest, body, what="experiment")
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            for parent in req.parents:  # continue only what the caller may read
                scope.experiment(s, parent, param="parents")
            exp = self.experiments.create(s, run_id=identity.run_id, owner_key_id=identity.key_id, name=req.name,
                                          parents=list(req.parents), implicit=False)
            if req.note is not None:
                s.add(Annotation(id=new_id("ann"), run_id=identity.run_id, key_id=identity.key_id, kind=NOTE,
                                 experiment_ids=[exp.id], body={"note": req.note}))
            s.flush()
            return self._views(s, scope, [exp])[0]

    def get_experiment(self, identity: Identity, experiment_id: str) -> dict[str, Any]:
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            exp = scope.experiment(s, experiment_id)
            view = self._views(s, scope, [exp])[0]
            events = s.scalars(select(RecordEvent).where(RecordEvent.run_id == scope.run_id,
                                                         RecordEvent.experiment_id == exp.id)
                               .order_by(RecordEvent.seq))
            view["events"] = [agent_view.event(event_view(e)) for e in events]
            view["annotations"] = [annotation_view(a) for a in self._annotations(s, scope, None, exp.id)]
            return view

    def diff(self, identity: Identity, a: str, b: str) -> dict[str, Any]:
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            ea, eb = scope.experiment(s, a, param="a"), scope.experiment(s, b, param="b")
            va, vb = self._views(s, scope, [ea, eb])
            job_ids = [x["job_id"] for v in (va, vb) for x in v["action"] if x["kind"] == "training"]
            return queries.diff(va, vb, training_read.job_configs(s, scope.run_id, job_ids))

    # -- checkpoints -----------------------------------------------------------------------

    def lineage(self, identity: Identity, checkpoint_id: str) -> dict[str, Any]:
        """A visible checkpoint's whole chain back to its base model: the provenance of what the
        caller may read includes what it was trained from."""
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            events = self._lineage_events(s, scope.run_id)
            links = generations.chain(s, scope.run_id)  # a run started with --from: its chain, generation 1 first
            granted = generations.row_of(s, scope.run_id)
            earlier = {link.run_id: link.generation for link in links[:-1]}
            inherited = [(e, earlier[e.run_id]) for e in self._lineage_events(s, *earlier)] if granted else []
        found = queries.lineage(checkpoint_id, events, inherited,
                                granted.initial_model if granted and granted.initial_weights_hash else None)
        first = found["links"][0] if found else None
        if found is None or first is None or ("inherited" not in first
                                              and not scope.sees_experiment_id(first["experiment_id"])):
            raise NotFound(f"checkpoint {checkpoint_id} not found", param="id")
        return found

    @staticmethod
    def _lineage_events(s: Session, *run_ids: str) -> list[RecordEvent]:
        if not run_ids:
            return []
        return list(s.scalars(select(RecordEvent).where(RecordEvent.run_id.in_(run_ids),
                                                        RecordEvent.kind.in_(queries.LINEAGE_KINDS))
                              .order_by(RecordEvent.seq)))

    def best_checkpoint(self, identity: Identity, params: dict[str, str]) -> dict[str, Any]:
        benchmark = params.get("benchmark") or None
        split = params.get("split") or "dev"
        audited = params.get("audited", "").lower()
        if audited not in ("", "true", "false"):
            raise Unprocessable("audited must be true or false", param="audited")
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            views = self._views(s, scope, self._visible(s, scope))
            checkpoints = {str(d.get("checkpoint_id")) for d in s.scalars(
                select(RecordEvent.data).where(RecordEvent.run_id == scope.run_id,
                                               RecordEvent.kind == CHECKPOINT_REGISTERED))}
        best = queries.best_checkpoint(views, checkpoints, benchmark=benchmark, split=split,
                                       audited_only=audited == "true")
        if best is None:
            what = f"on {benchmark}/{split}" if benchmark else f"on the {split} split"
            which = "accepted" if audited == "true" else "accepted or unaudited"
            raise NotFound(f"no {which} experiment has evaluated a checkpoint {what}", param="benchmark")
        return best

    # -- annotations -----------------------------------------------------------------------

    def create_annotation(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        kind = body.get("kind")
        model = ANNOTATION_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise Unprocessable(f"kind must be one of {', '.join(ANNOTATION_KINDS)}", param="kind")
        note = validated(model, body, what=f"{kind} annotation")
        fields = note.model_dump(mode="json", exclude={"kind", "experiment_ids"}, exclude_none=True)
        ids = list(dict.fromkeys(note.experiment_ids))
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            for experiment_id in ids:  # evidence must be something the writer may read
                scope.experiment(s, experiment_id, param="experiment_ids")
            for annotation_id in fields.get("reacts_to", []):  # so must what a decision answers
                answered = s.get(Annotation, annotation_id)
                if answered is None or answered.run_id != identity.run_id or not scope.sees_annotation(answered):
                    raise NotFound(f"annotation {annotation_id} not found", param="reacts_to")
            row = Annotation(id=new_id("ann"), run_id=identity.run_id, key_id=identity.key_id, kind=note.kind,
                             experiment_ids=ids, body=fields)
            s.add(row)
            s.flush()
            return annotation_view(row)

    def list_annotations(self, identity: Identity, params: dict[str, str]) -> list[dict[str, Any]]:
        kind = params.get("kind") or None
        if kind is not None and kind not in (*ANNOTATION_KINDS, NOTE):
            raise Unprocessable(f"kind must be one of {', '.join((*ANNOTATION_KINDS, NOTE))}", param="kind")
        with self.store.transaction() as s:
            scope = scope_of(s, identity)
            experiment = params.get("experiment") or None
            if experiment is not None:
                scope.experiment(s, experiment, param="experiment")
            return [annotation_view(a) for a in self._annotations(s, scope, kind, experiment)]

    @staticmethod
    def _annotations(s: Session, scope: Scope, kind: str | None, experiment: str | None) -> list[Annotation]:
        q = select(Annotation).where(Annotation.run_id == scope.run_id)
        if kind is not None:
            q = q.where(Annotation.kind == kind)
        rows = [a for a in s.scalars(q.order_by(Annotation.created_at, Annotation.id)) if scope.sees_annotation(a)]
        return [a for a in rows if experiment is None or experiment in (a.experiment_ids or [])]

    # -- chain -----------------------------------------------------------------------------

    def chain(self, identity: Identity) -> dict[str, Any]:
        view = self.events.verify(identity.run_id).view()
        # where the anchor lives (a path, a Redis host) and why it failed are the operator's to know
        view["anchor"] = {k: v for k, v in view["anchor"].items() if k in ("status", "seq", "heads")}
        return {"object": "chain", **view}

    # -- operator --------------------------------------------------------------------------

    def _operator_run(self, identity: Identity, run_id: str) -> Scope:
        """A run's whole record, or the operator's own (``operator``: scoring and baselines)."""
        if not identity.operator:
            raise PermissionDenied("operator only")
        if run_id == OPERATOR_RECORD:
            return run_scope(run_id)
        with self.store.transaction() as s:
            key = s.get(ApiKey, run_id)
            if key is None or key.parent_id is not None:
                raise NotFound(f"run {run_id} not found", param="run_id")
        return run_scope(run_id)

    def operator_events(self, identity: Identity, run_id: str, params: dict[str, str]) -> dict[str, Any]:
        scope = self._operator_run(identity, run_id)
        with self.store.transaction() as s:
            return self._events_page(s, scope, params, operator=True)

    def operator_experiments(self, identity: Identity, run_id: str) -> list[dict[str, Any]]:
        """The run's experiments with the reasons of its newest audit as the operator reads them
        (with evidence; the table keeps the run key's form)."""
        scope = self._operator_run(identity, run_id)
        with self.store.transaction() as s:
            views = self._views(s, scope, self._visible(s, scope), operator=True)
            newest = s.scalars(select(AuditRow).where(AuditRow.run_id == run_id)
                               .order_by(AuditRow.created_at.desc(), AuditRow.id.desc())).first()
        audited = {str(e.get("id")): e.get("reasons") for e in ((newest.report or {}).get("experiments") or [])
                   if isinstance(e, dict)} if newest is not None else {}
        for view in views:
            if isinstance(audited.get(view["id"]), list):
                view["reasons"] = audited[view["id"]]
        return views

    def operator_chain(self, identity: Identity, run_id: str) -> dict[str, Any]:
        self._operator_run(identity, run_id)
        return {"object": "chain", **self.events.verify(run_id).view()}

    def operator_audits(self, identity: Identity, params: dict[str, str]) -> list[dict[str, Any]]:
        if not identity.operator:
            raise PermissionDenied("operator only")
        q = select(AuditRow)
        if run_id := params.get("run_id"):
            q = q.where(AuditRow.run_id == run_id)
        with self.store.transaction() as s:
            return [audit_view(a) for a in s.scalars(q.order_by(AuditRow.created_at.desc(), AuditRow.id))]

    def operator_audit(self, identity: Identity, run_id: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Audit a run (body: optional ``{"trajectory": "<the research agent's trajectory>"}``)."""
        self._operator_run(identity, run_id)
        trajectory = (body or {}).get("trajectory")
        if trajectory is not None and not isinstance(trajectory, str):
            raise Unprocessable("trajectory must be a string (the trajectory file's text)", param="trajectory")
        from services.records.audits.context import AuditContext
        from services.records.audits.run import audit_run  # the audits are heavy: loaded on use

        ctx = AuditContext(store=self.store, config=self.context.config, data_dir=self.context.data_dir,
                           events=self.events, run_id=run_id, secrets=self.context.secrets,
                           gateway_url=self.context.settings.gateway_url,
                           models_dir=self.context.settings.resolved_models_dir())
        result: dict[str, Any] = audit_run(ctx, trajectory=trajectory)
        return result

    def operator_monitor(self, identity: Identity) -> dict[str, Any]:
        """One round of the live monitor (services/records/monitor.py): each due run's new turns judged."""
        if not identity.operator:
            raise PermissionDenied("operator only")
        from services.records.monitor import MonitorSetup, run_round

        return run_round(MonitorSetup(store=self.store, config=self.context.config, events=self.events,
                                      data_dir=self.context.data_dir, gateway_url=self.context.settings.gateway_url))
