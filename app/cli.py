"""Flask CLI: `flask db upgrade`, `flask products create NAME`, … (`flask token mint` is app.token_cli,
a plugin command that needs no app)."""

from __future__ import annotations

import functools
import json

import click
from flask import current_app
from flask.cli import with_appcontext
from marshmallow import ValidationError
from sqlalchemy import select

from app.db import db
from app.embeddings.jobs import queue_backfill
from app.embeddings.pipeline import is_enabled
from app.entities.indexes import sync_definition
from app.entities.models import EntityDefinition
from app.errors import ApiError
from app.observability import tracing
from app.ops.rollout import (
    get_rollout,
    list_artifacts,
    list_rollouts,
    publish,
    resume,
    rollout_outcomes,
    rollout_to_wire,
)
from app.ops.seed_jobs import queue_seed
from app.ops.seeding import SeedRequestSchema, seed_org
from app.platform_models import Product

CLI_SERVICE = "platform-gateway-cli"  # the traces' service.name unless OTEL_SERVICE_NAME says otherwise


def traced_command(command):
    """A command that changes state (migrates, provisions, seeds, publishes, queues, builds indexes) runs
    under a root span named by its command path (`flask seed org`) when OTEL_TRACES_EXPORTER turns
    tracing on, like the API and the worker; the spans are exported before the command returns. The
    read-only commands (`list`, `status`) are not traced. With tracing off: the OTEL_* settings are read
    and nothing of the SDK is imported."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        was_on = tracing.ENABLED
        if not tracing.configure(CLI_SERVICE):
            return command(*args, **kwargs)
        if not was_on:
            db.dispose()  # connections opened before psycopg was instrumented: new ones make SQL spans
        try:
            # `flask <group> <command>`, whatever name the program was started by
            words = click.get_current_context().command_path.split()[1:]
            with tracing.command_span(" ".join(["flask", *words])):
                return command(*args, **kwargs)
        finally:
            tracing.shutdown()  # the batch processor's last spans, before the process exits

    return run


db_cli = click.Group("db", help="Database migrations.")
products_cli = click.Group("products", help="Product schemas.")
entities_cli = click.Group("entities", help="Entity store maintenance.")


@db_cli.command("upgrade")
@with_appcontext
@traced_command
def db_upgrade() -> None:
    """Migrate the platform schema and every product schema to head."""
    from migrations.runner import upgrade_all  # alembic: imported only where a migration runs

    slugs = upgrade_all(db.engine, current_app.config["DEFAULT_PRODUCT"])
    click.echo(f"migrated platform + {len(slugs)} product schema(s): {', '.join(slugs)}")


@products_cli.command("create")
@click.argument("name")
@with_appcontext
@traced_command
def products_create(name: str) -> None:
    """Provision product NAME: register it and migrate its schema."""
    from migrations.runner import create_product  # alembic: imported only where a migration runs

    try:
        slug = create_product(db.engine, name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    click.echo(f"product {slug} ready (schema product_{slug})")


@products_cli.command("list")
@with_appcontext
def products_list() -> None:
    """List provisioned products."""
    with db.engine.connect() as conn:
        for row in conn.execute(select(Product.slug, Product.schema_name)):
            click.echo(f"{row.slug}\t{row.schema_name}")


embeddings_cli = click.Group("embeddings", help="Semantic-search embeddings.")


def definition_options(command):
    """--product, --org, --entity: which definitions a maintenance command works on."""
    command = click.option("--entity", default=None, help="only definitions with this name")(command)
    command = click.option("--org", default=None, help="only this org_id")(command)
    return click.option("--product", default=None, help="product (default: the default product)")(command)


@embeddings_cli.command("backfill")
@definition_options
@with_appcontext
@traced_command
def embeddings_backfill(product, org, entity) -> None:
    """Re-embed the records of every embeddings-enabled definition without a current vector.

    Run it after changing EMBEDDINGS_BACKEND or EMBEDDINGS_MODEL (stored vectors name the model
    that made them, so they stop being served). Queues one `embeddings.backfill` walk per definition: a
    leased job written with its outbox row (app.embeddings.jobs), so it runs even if Redis is down now.
    """
    product = product or current_app.config["DEFAULT_PRODUCT"]
    stmt = select(EntityDefinition).where(EntityDefinition.is_active.is_(True))
    if org:
        stmt = stmt.where(EntityDefinition.org_id == org)
    if entity:
        stmt = stmt.where(EntityDefinition.name == entity)
    with db.product_session(product) as session:
        targets = [(d.org_id, d.id, d.name) for d in session.scalars(stmt) if is_enabled(d.embeddings_config)]
    for org_id, entity_id, name in targets:
        with db.product_session(product) as session:
            queue_backfill(session, product, org_id, entity_id, "")  # "": the definition's present setup
        click.echo(f"queued backfill: product={product} org={org_id} entity={name} ({entity_id})")
    click.echo(f"{len(targets)} definition(s) queued")


seed_cli = click.Group("seed", help="Organization seeding.")


@seed_cli.command("org")
@click.option("--title", required=True, help="organization title")
@click.option("--domain", "main_domain", required=True, help="main domain (the org id is derived from it)")
@click.option("--product", default=None, help="product (default: the default product)")
@click.option("--admin-email", required=True)
@click.option("--first-name", required=True)
@click.option("--last-name", required=True)
@click.option("--queue/--inline", default=False, show_default=True,
              help="send seed.org to the `seed` queue instead of running it here")
@with_appcontext
@traced_command
def seed_org_command(title, main_domain, product, admin_email, first_name, last_name, queue) -> None:
    """Create an organization, its admin user and the 15 platform artifacts (idempotent)."""
    body = {"org": {"title": title, "mainDomain": main_domain,
                    "product": product or current_app.config["DEFAULT_PRODUCT"]},
            "admin": {"email": admin_email, "firstName": first_name, "lastName": last_name}}
    if queue:  # a leased job through the outbox, as the HTTP 202 (app.ops.seed_jobs)
        try:
            body = SeedRequestSchema().load(body)
        except ValidationError as exc:
            raise click.ClickException(json.dumps(exc.normalized_messages())) from None
        with db.unit_of_work():  # the command's unit of work: the task is sent once it commits
            task_id = queue_seed(db.session, body)
        click.echo(f"queued seed.org task {task_id}")
        return
    try:
        report = seed_org(body)
    except ApiError as exc:
        raise click.ClickException(f"{exc.message} {json.dumps(exc.details or {})}") from None
    for line in report["artifacts"]:
        click.echo(f"{line['status']:<9} {line['id']:<24} v{line['artifactVersion']}  {line['objectId']}")
    click.echo(f"org {report['orgId']} ({report['product']}), admin {report['admin']['email']} "
               f"({report['admin']['id']}): {report['summary']['created']} created, "
               f"{report['summary']['existing']} existing")


artifacts_cli = click.Group("artifacts", help="Platform artifact registry and rollouts.")


@artifacts_cli.command("list")
@with_appcontext
def artifacts_list() -> None:
    """Every platform artifact with its current artifactVersion."""
    with db.unit_of_work():  # the registry read syncs the release's built-ins first
        artifacts = list_artifacts()
    for a in artifacts:
        click.echo(f"{a.id:<26} {a.kind:<9} v{a.artifact_version}")


@artifacts_cli.command("publish")
@click.argument("file", type=click.File("r"))
@click.option("--rollout/--no-rollout", default=True, show_default=True, help="start rolling it out")
@with_appcontext
@traced_command
def artifacts_publish(file, rollout) -> None:
    """Publish FILE (JSON `{kind, name, artifactVersion, definition}`) and roll it out to every org."""
    try:
        doc = json.load(file)
    except ValueError as exc:
        raise click.ClickException(f"{file.name} is not JSON: {exc}") from None
    try:
        artifact, started = publish(doc, created_by="cli", rollout=rollout)  # a unit of work of its own
    except ApiError as exc:
        raise click.ClickException(f"{exc.message} {json.dumps(exc.details or {})}") from None
    click.echo(f"published {artifact.id} v{artifact.artifact_version}")
    if started is not None:
        click.echo(f"rollout {started.id} queued for {started.total} org(s); follow it with "
                   f"`flask artifacts status {started.id}`")


@artifacts_cli.command("status")
@click.argument("rollout_id", required=False)
@click.option("--outcome", default=None, help="list only orgs with this outcome (e.g. forked)")
@with_appcontext
def artifacts_status(rollout_id, outcome) -> None:
    """Progress of recent rollouts, or of ROLLOUT_ID with its per-org outcomes."""
    def line(r) -> str:
        w = rollout_to_wire(r)
        counts = " ".join(f"{k}={v}" for k, v in w["counts"].items() if v)
        return (f"{w['id']}  {w['artifactId']} v{w['artifactVersion']}  {w['status']:<10} "
                f"{w['processed']}/{w['total']}  {counts}{'  error: ' + w['error'] if w['error'] else ''}")

    if not rollout_id:
        for r in list_rollouts():
            click.echo(line(r))
        return
    try:
        click.echo(line(get_rollout(rollout_id)))
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    after = None
    while True:
        page = rollout_outcomes(rollout_id, outcome, after, 1000)
        for o in page:
            click.echo(f"  {o.org_id}/{o.product}\t{o.outcome}\t{o.detail or ''}")
        if len(page) < 1000:
            break
        after = f"{page[-1].org_id}/{page[-1].product}"


@artifacts_cli.command("resume")
@click.argument("rollout_id")
@with_appcontext
@traced_command
def artifacts_resume(rollout_id) -> None:
    """Continue a stopped rollout from its cursor."""
    try:
        r = resume(rollout_id)  # a unit of work of its own
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"rollout {r.id}: {r.status}")


@entities_cli.command("sync-indexes")
@definition_options
@with_appcontext
@traced_command
def entities_sync_indexes(product, org, entity) -> None:
    """Create (CONCURRENTLY) or drop the per-definition indexes and typed projections of every
    definition, now.

    What task `bulk.entity_indexes` does after a schema change or a bulk create; run it once after
    deploying the feature or changing ENTITY_INDEX_MIN_RECORDS. Idempotent.
    """
    product = product or current_app.config["DEFAULT_PRODUCT"]
    stmt = select(EntityDefinition.id, EntityDefinition.org_id, EntityDefinition.name)
    if org:
        stmt = stmt.where(EntityDefinition.org_id == org)
    if entity:
        stmt = stmt.where(EntityDefinition.name == entity)
    with db.product_session(product) as session:
        targets = list(session.execute(stmt))
    for definition_id, org_id, name in targets:
        result = sync_definition(product, definition_id, concurrently=True)
        click.echo(f"org={org_id} entity={name} ({definition_id}): created {len(result['created'])}, "
                   f"dropped {len(result['dropped'])}")
    click.echo(f"{len(targets)} definition(s) checked")
