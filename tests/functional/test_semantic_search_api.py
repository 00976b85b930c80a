"""Semantic search (`$similar`) end to end: records are embedded by a real Celery worker on Redis with
the local all-MiniLM-L6-v2 model, then queried through the HTTP API."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from tests.conftest import wait_for
from tests.fake_embeddings_server import FakeEmbeddingsServer
from tests.functional.entities_support import BASE, create_definition, create_record, query

SCHEMA = {"type": "object", "properties": {
    "body": {"type": "text"},
    "category": {"type": "dropdown", "options": ["vehicles", "food", "nature", "space"]},
    "rating": {"type": "int"},
}}
ENABLED = {"enabled": True, "fields": ["body"]}
TOPICS = [
    {"name": "Family sedan review", "fields": {"category": "vehicles", "rating": 4, "body":
        "This car has a quiet engine, comfortable seats and good fuel economy on the motorway."}},
    {"name": "Sourdough bread recipe", "fields": {"category": "food", "rating": 5, "body":
        "Mix flour, water and salt with the starter, knead the dough, let it rise and bake the loaf in a hot oven."}},
    {"name": "Growing tomatoes", "fields": {"category": "nature", "rating": 3, "body":
        "Plant the seedlings in sunny garden soil, water them every morning and tie the stems to stakes."}},
    {"name": "Watching Jupiter", "fields": {"category": "space", "rating": 2, "body":
        "Through a small telescope the planet shows its cloud bands and four bright moons at night."}},
    {"name": "Chocolate cake", "fields": {"category": "food", "rating": 4, "body":
        "Whisk eggs and sugar, fold in cocoa and flour, and bake the sponge for thirty minutes."}},
]


def similar(client, headers, entity, text, **params):
    filters = params.pop("filters", {})
    resp = query(client, headers, entity, filters={**filters, "$similar": text}, **params)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def names_of(result) -> list[str]:
    return [r["name"] for r in result["records"]]


def wait_embedded(client, headers, entity, count, text="anything", timeout=90.0):
    """Until `count` records take part in $similar (i.e. the worker stored current vectors)."""
    return wait_for(lambda: similar(client, headers, entity, text, pageSize=100)["totalCount"] == count,
                    timeout=timeout)


@pytest.fixture()
def topics(client, auth, celery_worker):
    headers = auth()
    create_definition(client, headers, "articles", SCHEMA, embeddingsConfig=ENABLED)
    records = {r["name"]: create_record(client, headers, "articles", r) for r in TOPICS}
    wait_embedded(client, headers, "articles", len(TOPICS))
    return headers, records


def test_similar_is_never_answered_from_a_reused_filter_shape(client, topics, monkeypatch):
    """With compiled filter shapes reused (app.entities.query.REUSE_SHAPES), a `$similar` filter is still
    compiled with its similarity resolved: the same ranking and count, before and after plain queries of
    the same structure (a shape without `$similar` cannot stand in for it)."""
    from app.entities import query as entity_query

    headers, _ = topics
    monkeypatch.setattr(entity_query, "REUSE_SHAPES", True)
    for _ in range(3):
        plain = query(client, headers, "articles", filters={"rating": {"$gte": 0}})
        assert plain.status_code == 200, plain.get_json()
        cars = similar(client, headers, "articles", "automobile")
        assert names_of(cars)[0] == "Family sedan review" and cars["totalCount"] == len(TOPICS)
        narrowed = similar(client, headers, "articles", "automobile", filters={"rating": {"$gte": 0}})
        assert names_of(narrowed)[0] == "Family sedan review" and narrowed["totalCount"] == len(TOPICS)


def test_query_ranks_the_record_about_the_topic_first(client, topics):
    headers, _ = topics
    cars = similar(client, headers, "articles", "automobile")
    assert names_of(cars)[0] == "Family sedan review"
    baking = similar(client, headers, "articles", "baking")
    assert names_of(baking)[0] in {"Sourdough bread recipe", "Chocolate cake"}
    assert set(names_of(baking)[:2]) == {"Sourdough bread recipe", "Chocolate cake"}
    bread = similar(client, headers, "articles", "how to bake bread")
    assert names_of(bread)[0] == "Sourdough bread recipe"
    for result in (cars, baking, bread):
        distances = [r["distance"] for r in result["records"]]
        assert distances == sorted(distances)
        assert all(0 <= d <= 2 for d in distances)
        assert result["totalCount"] == len(TOPICS)


def test_plain_queries_carry_no_distance(client, topics):
    headers, _ = topics
    resp = query(client, headers, "articles")
    assert all("distance" not in r for r in resp.get_json()["records"])


def test_similar_combines_with_filters_paging_and_max_distance(client, topics):
    headers, _ = topics
    food = similar(client, headers, "articles", "automobile", filters={"category": "food"})
    assert set(names_of(food)) == {"Sourdough bread recipe", "Chocolate cake"}
    assert food["totalCount"] == 2
    rated = similar(client, headers, "articles", "baking",
                    filters={"rating": {"$gte": 4}, "$not": {"category": "food"}})
    assert names_of(rated) == ["Family sedan review"]

    everything = names_of(similar(client, headers, "articles", "baking", pageSize=10))
    page1 = similar(client, headers, "articles", "baking", pageSize=2, page=1)
    page2 = similar(client, headers, "articles", "baking", pageSize=2, page=2)
    page3 = similar(client, headers, "articles", "baking", pageSize=2, page=3)
    assert names_of(page1) + names_of(page2) + names_of(page3) == everything
    assert (page1["totalPages"], page1["hasNextPage"], page3["hasNextPage"]) == (3, True, False)

    full = similar(client, headers, "articles", "baking")["records"]
    cut = (full[1]["distance"] + full[2]["distance"]) / 2
    near = query(client, headers, "articles", filters={"$similar": {"query": "baking", "maxDistance": cut}})
    assert [r["name"] for r in near.get_json()["records"]] == [r["name"] for r in full[:2]]
    assert near.get_json()["totalCount"] == 2


def test_index_path_gives_the_exact_ranking(client, topics, make_app):
    """Forced onto the HNSW path (iterative scan, materialised candidates re-sorted exactly)."""
    headers, _ = topics
    indexed = make_app(EMBEDDINGS_EXACT_SEARCH_MAX_ROWS=0).test_client()
    for text, filters in (("baking", {}), ("automobile", {"rating": {"$gte": 3}})):
        exact = similar(client, headers, "articles", text, filters=filters)
        approx = similar(indexed, headers, "articles", text, filters=filters)
        assert [(r["id"], r["distance"]) for r in approx["records"]] == \
            [(r["id"], r["distance"]) for r in exact["records"]]
        pages = [similar(indexed, headers, "articles", text, filters=filters, pageSize=2, page=p) for p in (1, 2, 3)]
        assert [r["id"] for p in pages for r in p["records"]] == [r["id"] for r in exact["records"]]


def test_sort_by_overrides_distance_order_but_keeps_distance(client, topics):
    headers, _ = topics
    result = similar(client, headers, "articles", "automobile", sortBy="rating", sortOrder=1)
    assert [r["fields"]["rating"] for r in result["records"]] == [2, 3, 4, 4, 5]
    assert all(isinstance(r["distance"], float) for r in result["records"])


def test_field_level_similar_needs_an_embedded_field(client, topics):
    headers, _ = topics
    on_body = query(client, headers, "articles", filters={"body": {"$similar": "automobile"}}).get_json()
    assert on_body["records"][0]["name"] == "Family sedan review"
    on_other = query(client, headers, "articles", filters={"category": {"$similar": "automobile"}})
    assert on_other.status_code == 200 and on_other.get_json()["totalCount"] == 0


def test_search_and_similar_are_fused_by_reciprocal_rank(client, topics):
    headers, _ = topics
    text, meaning = "bake OR oven OR engine", "automobile"
    by_text = query(client, headers, "articles", filters={"$search": text}).get_json()["records"]
    matched = [r["id"] for r in by_text]
    assert len(matched) == 3  # the car (engine), the bread (bake, oven), the cake (bake)
    by_meaning = similar(client, headers, "articles", meaning, filters={"id": {"$in": matched}})["records"]
    text_rank = {r["id"]: i + 1 for i, r in enumerate(by_text)}
    meaning_rank = {r["id"]: i + 1 for i, r in enumerate(by_meaning)}
    expected = sorted(matched, key=lambda i: (-(1 / (60 + text_rank[i]) + 1 / (60 + meaning_rank[i])),
                                              next(r["distance"] for r in by_meaning if r["id"] == i)))
    fused = query(client, headers, "articles", filters={"$search": text, "$similar": meaning}).get_json()
    assert [r["id"] for r in fused["records"]] == expected
    assert fused["totalCount"] == 3
    assert all("distance" in r for r in fused["records"])


def test_updating_the_text_moves_the_record_in_the_ranking(client, topics):
    headers, records = topics
    garden = records["Growing tomatoes"]
    assert names_of(similar(client, headers, "articles", "automobile"))[0] == "Family sedan review"
    resp = client.put(f"{BASE}/articles/records/{garden['id']}", headers=headers, json={
        "name": "Racing cars", "fields": {"body": "Fast sports cars and motor vehicles race around the track."}})
    assert resp.status_code == 200
    wait_for(lambda: names_of(similar(client, headers, "articles", "automobile"))[0] == "Racing cars", timeout=60)
    assert similar(client, headers, "articles", "automobile")["totalCount"] == len(TOPICS)


def test_an_edit_outside_the_embedded_text_keeps_the_vector(client, topics, app):
    headers, records = topics
    cake = records["Chocolate cake"]
    before = _embedding_row(app, cake["id"])
    resp = client.put(f"{BASE}/articles/records/{cake['id']}", headers=headers, json={"fields": {"rating": 1}})
    assert resp.status_code == 200
    wait_for(lambda: _embedding_row(app, cake["id"]).record_version == 2)
    after = _embedding_row(app, cake["id"])
    assert after.content_hash == before.content_hash and after.updated_at > before.updated_at
    assert list(after.embedding) == list(before.embedding)


def _embedding_row(app, record_id):
    from app.db import db
    from app.embeddings.models import EntityEmbedding

    with app.app_context(), db.product_session("default") as session:
        return session.scalars(select(EntityEmbedding).where(EntityEmbedding.record_id == record_id)).one()


def test_bulk_writes_sync_and_async_are_embedded(client, auth, celery_worker):
    headers = auth()
    create_definition(client, headers, "notes", SCHEMA, embeddingsConfig=ENABLED)
    resp = client.post(f"{BASE}/notes/records/bulk/create", headers=headers,
                       json={"records": [TOPICS[0], TOPICS[1]]})
    assert resp.status_code == 200, resp.get_json()
    resp = client.post(f"{BASE}/notes/records/bulk/create", headers={**headers, "Prefer": "respond-async"},
                       json={"records": [TOPICS[2], TOPICS[3]]})
    assert resp.status_code == 202
    wait_embedded(client, headers, "notes", 4)
    ids = {r["name"]: r["id"] for r in query(client, headers, "notes", pageSize=10).get_json()["records"]}
    resp = client.post(f"{BASE}/notes/records/bulk/update", headers={**headers, "Prefer": "respond-async"},
                       json={"records": [{"id": ids["Watching Jupiter"], "fields": {
                           "body": "A slow cooker stew with beans, carrots and onions simmers all day."}}]})
    assert resp.status_code == 202
    wait_for(lambda: names_of(similar(client, headers, "notes", "cooking a stew"))[0] == "Watching Jupiter",
             timeout=60)


def test_disabled_or_missing_config_returns_no_results(client, auth, celery_worker):
    headers = auth()
    create_definition(client, headers, "plain", SCHEMA)
    create_definition(client, headers, "off", SCHEMA, embeddingsConfig={"enabled": False, "fields": ["body"]})
    for entity in ("plain", "off"):
        create_record(client, headers, entity, TOPICS[0])
        result = similar(client, headers, entity, "automobile")
        assert (result["totalCount"], result["records"]) == (0, [])
        assert query(client, headers, entity).get_json()["totalCount"] == 1


def test_enabling_later_backfills_existing_records(client, auth, celery_worker):
    headers = auth()
    create_definition(client, headers, "later", SCHEMA)
    for topic in TOPICS[:3]:
        create_record(client, headers, "later", topic)
    assert similar(client, headers, "later", "automobile")["totalCount"] == 0
    resp = client.put(f"{BASE}/definitions/later", headers=headers, json={"embeddingsConfig": ENABLED})
    assert resp.status_code == 200
    wait_embedded(client, headers, "later", 3)
    assert names_of(similar(client, headers, "later", "automobile"))[0] == "Family sedan review"

    # A new field list re-embeds everything: the name alone now (vectors of the old setup are not served)
    resp = client.put(f"{BASE}/definitions/later", headers=headers,
                      json={"embeddingsConfig": {"enabled": True, "fields": []}})
    assert resp.status_code == 200
    wait_embedded(client, headers, "later", 3)
    assert names_of(similar(client, headers, "later", "tomato plants"))[0] == "Growing tomatoes"


def test_tenants_never_see_each_others_vectors(client, auth, make_token, celery_worker):
    headers = auth()
    other = {"Authorization": f"Bearer {make_token(org=f'org-{uuid.uuid4().hex[:12]}')}"}
    for h, topic in ((headers, TOPICS[0]), (other, TOPICS[1])):
        create_definition(client, h, "shared", SCHEMA, embeddingsConfig=ENABLED)
        create_record(client, h, "shared", topic)
    wait_embedded(client, headers, "shared", 1)
    wait_embedded(client, other, "shared", 1)
    assert names_of(similar(client, headers, "shared", "baking")) == ["Family sedan review"]
    assert names_of(similar(client, other, "shared", "automobile")) == ["Sourdough bread recipe"]
    # another product of the same org has its own schema: nothing there
    create_definition(client, auth(product="other"), "shared", SCHEMA, embeddingsConfig=ENABLED)
    assert similar(client, auth(product="other"), "shared", "automobile")["totalCount"] == 0


def test_a_stale_vector_is_never_served(client, auth, celery_worker, make_app):
    """With the broker unreachable the update's embedding task is lost: the old vector must not be served."""
    headers = auth()
    create_definition(client, headers, "stale", SCHEMA, embeddingsConfig=ENABLED)
    record = create_record(client, headers, "stale", TOPICS[0])
    wait_embedded(client, headers, "stale", 1)

    offline = make_app(REDIS_URL="redis://127.0.0.1:1/0").test_client()
    resp = offline.put(f"{BASE}/stale/records/{record['id']}", headers=headers,
                       json={"fields": {"body": "A garden full of roses."}})
    assert resp.status_code == 200  # the write does not depend on the broker
    assert similar(offline, headers, "stale", "automobile")["totalCount"] == 0
    got = offline.get(f"{BASE}/stale/records/{record['id']}", headers=headers)
    assert got.status_code == 200 and got.get_json()["fields"]["body"] == "A garden full of roses."


DEAD_BROKER = "redis://127.0.0.1:1/0"  # the write's own task is lost; the test runs it under the fake's app


@pytest.fixture()
def fake():
    with FakeEmbeddingsServer(api_key="sk-test") as server:
        yield server


def remote_definition(make_app, fake, headers, config=ENABLED, **extra):
    """An app on the openai backend against the fake, and a definition "remote": (app, client, entity id)."""
    app = make_app(REDIS_URL=DEAD_BROKER, EMBEDDINGS_BACKEND="openai", EMBEDDINGS_ENDPOINT=fake.base_url,
                   EMBEDDINGS_API_KEY=fake.api_key, EMBEDDINGS_MODEL="text-embedding-3-small", **extra)
    client = app.test_client()
    return app, client, create_definition(client, headers, "remote", SCHEMA, embeddingsConfig=config)


def embedded_remote(make_app, fake, headers, org_id, config, **extra):
    """`remote_definition` with a record per topic of TOPICS, embedded in this process: (app, client, entity id)."""
    from app.embeddings.tasks import embed_records

    app, client, entity_id = remote_definition(make_app, fake, headers, config, **extra)
    records = [create_record(client, headers, "remote", t) for t in TOPICS]
    assert run_task(app, embed_records, "default", org_id, entity_id, [r["id"] for r in records]).successful()
    return app, client, entity_id


def run_task(app, task, *args):
    """Run a task in this process under `app` (its config: the fake endpoint), retries included."""
    from flask import g

    with app.app_context():
        g._celery_inline = True  # the shared task base would otherwise push the main test app
        return task.apply(args=args, throw=False)


def test_transient_embedder_failure_is_retried(make_app, fake, auth, org_id):
    """The OpenAI-compatible backend against a fake endpoint that answers 503 once: the task retries."""
    from app.db import db
    from app.embeddings.models import EntityEmbedding
    from app.embeddings.tasks import embed_records

    headers = auth()
    fake_app, client, entity_id = remote_definition(make_app, fake, headers, {**ENABLED, "dimensions": 64})
    record = create_record(client, headers, "remote", TOPICS[0])
    fake.fail_next(503, times=1)
    result = run_task(fake_app, embed_records, "default", org_id, entity_id, [record["id"]])
    assert result.successful() and result.result["embedded"] == 1
    assert [r.body for r in fake.requests] == [
        {"model": "text-embedding-3-small", "dimensions": 64,
         "input": ["Family sedan review\nbody: " + TOPICS[0]["fields"]["body"]]}] * 2  # the 503, then the retry
    with fake_app.app_context(), db.product_session("default") as session:
        row = session.get(EntityEmbedding, record["id"])
        assert (row.model, row.dimensions, row.record_version) == ("text-embedding-3-small", 64, 1)
    assert names_of(similar(client, headers, "remote", "automobile")) == ["Family sedan review"]

    fake.fail_next(401, times=1)  # the query's embedding refused: 503 in the envelope, not a 500
    resp = query(client, headers, "remote", filters={"$similar": "never cached before"})
    assert resp.status_code == 503
    assert resp.get_json()["error"]["code"] == "SERVICE_UNAVAILABLE"


def test_retries_stop_at_the_maximum(make_app, fake, auth, org_id):
    from app.embeddings import EmbedderTransientError
    from app.embeddings.tasks import embed_records

    headers = auth()
    fake_app, client, entity_id = remote_definition(make_app, fake, headers, EMBEDDINGS_TASK_MAX_RETRIES=2)
    record = create_record(client, headers, "remote", TOPICS[0])
    fake.fail_next(502, times=5)
    result = run_task(fake_app, embed_records, "default", org_id, entity_id, [record["id"]])
    assert result.failed() and isinstance(result.result, EmbedderTransientError)
    assert len(fake.requests) == 3  # the first try and two retries


def test_permanent_failure_leaves_the_record_readable_but_unranked(make_app, fake, auth, org_id):
    from app.embeddings.tasks import EmbeddingFailed, embed_records

    headers = auth()
    fake_app, client, entity_id = remote_definition(make_app, fake, headers, EMBEDDINGS_DIMENSIONS=32)
    created = sorted((create_record(client, headers, "remote", t) for t in TOPICS[:2]), key=lambda r: r["id"])
    bad, good = created  # records are embedded in id order: the batch, then the first, then the second
    fake.fail_next(400, {"error": {"message": "input rejected", "code": "invalid_input"}}, times=2)
    result = run_task(fake_app, embed_records, "default", org_id, entity_id, [good["id"], bad["id"]])
    assert [len(r.body["input"]) for r in fake.requests] == [2, 1, 1]
    assert result.failed() and isinstance(result.result, EmbeddingFailed) and bad["id"] in str(result.result)
    assert names_of(similar(client, headers, "remote", "automobile")) == [good["name"]]
    assert client.get(f"{BASE}/remote/records/{bad['id']}", headers=headers).status_code == 200
    assert query(client, headers, "remote").get_json()["totalCount"] == 2


def test_redelivered_task_changes_nothing(client, topics, app):
    from app.embeddings import pipeline

    headers, records = topics
    ids = [r["id"] for r in records.values()]
    before = {i: _embedding_row(app, i).updated_at for i in ids}
    entity_id = next(iter(records.values()))["entityId"]
    with app.app_context():
        outcome = pipeline.embed_records("default", _org_of(app, ids[0]), entity_id, ids)
    assert (outcome.embedded, outcome.restamped, outcome.skipped) == (0, 0, len(ids))
    assert {i: _embedding_row(app, i).updated_at for i in ids} == before


def _org_of(app, record_id):
    return _embedding_row(app, record_id).org_id


def test_stored_vectors_have_model_dimensions_and_hash(client, topics, app):
    from app.embeddings import embedding_content_hash

    _, records = topics
    row = _embedding_row(app, records["Watching Jupiter"]["id"])
    assert row.model == "sentence-transformers/all-MiniLM-L6-v2" and row.dimensions == 384
    text = "Watching Jupiter\nbody: " + TOPICS[3]["fields"]["body"]
    assert row.content_hash == embedding_content_hash(row.model, None, text)
    assert len(row.embedding) == 384


def test_cli_backfill_re_embeds_records_whose_vectors_are_gone(client, auth, app, org_id, celery_worker):
    """`flask embeddings backfill`: what an operator runs after EMBEDDINGS_MODEL/backend changes."""
    from sqlalchemy import delete

    from app.db import db
    from app.embeddings.models import EntityEmbedding

    headers = auth()
    create_definition(client, headers, "cli_backfill", SCHEMA, embeddingsConfig=ENABLED)
    for topic in TOPICS[:3]:
        create_record(client, headers, "cli_backfill", topic)
    wait_embedded(client, headers, "cli_backfill", 3)
    with app.app_context(), db.product_session("default") as session:
        session.execute(delete(EntityEmbedding).where(EntityEmbedding.org_id == org_id))
    assert similar(client, headers, "cli_backfill", "automobile")["totalCount"] == 0

    result = app.test_cli_runner().invoke(args=["embeddings", "backfill", "--org", org_id])
    assert result.exit_code == 0, result.output
    assert "entity=cli_backfill" in result.output and "1 definition(s) queued" in result.output
    wait_embedded(client, headers, "cli_backfill", 3)
    assert names_of(similar(client, headers, "cli_backfill", "automobile"))[0] == "Family sedan review"

    other = app.test_cli_runner().invoke(args=["embeddings", "backfill", "--org", "org-that-has-nothing"])
    assert other.exit_code == 0 and "0 definition(s) queued" in other.output


def test_total_count_is_the_number_of_records_with_a_current_vector(client, auth, app, org_id, celery_worker):
    """The exact totalCount of `$similar` is counted from the records' own stamp (migration v0003), not
    by joining the vectors: it must equal the records that really have a current vector, through
    a vector going stale (record version moved on), re-embedding, a re-stamp and a lost vector."""
    from sqlalchemy import delete, func, update

    from app.db import db
    from app.embeddings.models import EntityEmbedding
    from app.embeddings.pipeline import embed_records
    from app.entities.models import EntityDefinition, EntityRecord

    headers = auth()
    create_definition(client, headers, "stamped", SCHEMA, embeddingsConfig=ENABLED)
    records = [create_record(client, headers, "stamped", topic) for topic in TOPICS[:4]]
    wait_embedded(client, headers, "stamped", 4)
    R, E = EntityRecord.__table__, EntityEmbedding.__table__

    def truth() -> int:
        with app.app_context(), db.product_session("default") as session:
            return session.scalar(select(func.count()).select_from(R.join(E, E.c.record_id == R.c.id)).where(
                R.c.org_id == org_id, R.c.is_active.is_(True), E.c.record_version == R.c.version,
                R.c.entity_id == select(EntityDefinition.id).where(EntityDefinition.org_id == org_id,
                                                                  EntityDefinition.name == "stamped")
                .scalar_subquery()))

    def total(**params) -> int:
        return similar(client, headers, "stamped", "automobile", pageSize=100, **params)["totalCount"]

    assert total() == truth() == 4
    stale = records[0]["id"]
    with app.app_context(), db.product_session("default") as session:  # a record update whose task has not run
        session.execute(update(R).where(R.c.id == stale).values(version=R.c.version + 1))
    assert truth() == 3 and total() == 3
    assert stale not in [r["id"] for r in similar(client, headers, "stamped", "automobile", pageSize=100)["records"]]
    with app.app_context():  # the task re-embeds it (same text: the vector is re-stamped with the new version)
        embed_records("default", org_id, records[0]["entityId"], [stale])
    assert truth() == 4 and total() == 4

    resp = client.put(f"{BASE}/stamped/records/{records[1]['id']}", headers=headers, json={
        "fields": {"body": "A rocket launch carries a satellite into orbit around the earth."}})
    assert resp.status_code == 200, resp.get_json()
    wait_for(lambda: names_of(similar(client, headers, "stamped", "spacecraft orbit"))[0] == TOPICS[1]["name"],
             timeout=90.0)
    assert truth() == 4 and total() == 4

    with app.app_context(), db.product_session("default") as session:  # a vector lost (an operator's DELETE)
        session.execute(delete(E).where(E.c.record_id == records[2]["id"]))
    assert truth() == 3 and total() == 3
    # with maxDistance every candidate's distance is computed: the count agrees with the page
    for max_distance, expected in ((2.0, 3), (0.0, 0)):
        resp = query(client, headers, "stamped", pageSize=100,
                     filters={"$similar": {"query": "automobile", "maxDistance": max_distance}})
        assert resp.status_code == 200, resp.get_json()
        assert resp.get_json()["totalCount"] == len(resp.get_json()["records"]) == expected


def test_total_count_counter_stays_exact_through_every_write(make_app, fake, auth, org_id):
    """`$similar` alone counts from the per-definition counter of stamped records (migration v0004):
    it must equal the records that really have a current vector after each kind of write — insert,
    re-embedding, an update that makes the vector stale, a deactivation, a hard delete, a bulk create,
    a vector lost, concurrent writers (which must not wait on one another) and a rolled-back write."""
    import threading

    from sqlalchemy import delete, func, text, update

    from app.db import db, schema_for
    from app.embeddings.models import EMBEDDED_COUNTS, EntityEmbedding
    from app.embeddings.tasks import embed_records
    from app.entities.models import EntityRecord

    headers = auth()
    fake_app, client, entity_id = remote_definition(make_app, fake, headers, {**ENABLED, "dimensions": 16})
    R, E, C = EntityRecord.__table__, EntityEmbedding.__table__, EMBEDDED_COUNTS

    def truth() -> int:  # joined with the vectors, as the page does
        with fake_app.app_context(), db.product_session("default") as session:
            return session.scalar(select(func.count()).select_from(R.join(E, E.c.record_id == R.c.id)).where(
                R.c.org_id == org_id, R.c.entity_id == entity_id, R.c.is_active.is_(True),
                E.c.record_version == R.c.version))

    def total() -> int:
        resp = client.post(f"{BASE}/remote/records/query", headers={**headers, "Prefer": "count=exact"},
                           json={"query": {"filters": {"$similar": "automobile"}, "pageSize": 100}})
        assert resp.status_code == 200 and resp.headers["Preference-Applied"] == "count=exact"
        result = resp.get_json()
        # with another condition the count goes through the stamp index, not the counter: both agree
        filtered = similar(client, headers, "remote", "automobile", pageSize=100, filters={"rating": {"$gte": 0}})
        assert filtered["totalCount"] == result["totalCount"] == len(result["records"])
        return result["totalCount"]

    def embed(*ids):
        assert run_task(fake_app, embed_records, "default", org_id, entity_id, list(ids)).successful()

    def sql(statement):
        with fake_app.app_context(), db.product_session("default") as session:
            session.execute(statement)

    records = [create_record(client, headers, "remote", t) for t in TOPICS]  # insert
    assert total() == truth() == 0
    embed(*[r["id"] for r in records])
    assert total() == truth() == 5
    resp = client.put(f"{BASE}/remote/records/{records[0]['id']}", headers=headers,  # stale until re-embedded
                      json={"fields": {"body": "A rocket launch carries a satellite into orbit."}})
    assert resp.status_code == 200
    assert total() == truth() == 4
    embed(records[0]["id"])
    assert total() == truth() == 5
    embed(records[0]["id"])  # a redelivered task: the stamp is unchanged, so is the count
    assert total() == truth() == 5
    assert client.delete(f"{BASE}/remote/records/{records[1]['id']}", headers=headers).status_code in (200, 204)
    assert total() == truth() == 4  # deactivated
    sql(delete(R).where(R.c.id == records[2]["id"]))  # hard delete (its vector goes by cascade)
    assert total() == truth() == 3
    sql(delete(E).where(E.c.record_id == records[3]["id"]))  # a vector lost
    assert total() == truth() == 2
    embed(records[3]["id"])
    assert total() == truth() == 3

    resp = client.post(f"{BASE}/remote/records/bulk/create", headers=headers,
                       json={"records": [{"name": f"bulk {i}", "fields": {"body": f"note {i}", "rating": i}}
                                         for i in range(30)]})
    assert resp.status_code == 200, resp.get_json()
    bulk_ids = [r["id"] for r in query(client, headers, "remote", pageSize=100,
                                       filters={"name": {"$startsWith": "bulk"}}).get_json()["records"]]
    assert len(bulk_ids) == 30 and total() == truth() == 3
    embed(*bulk_ids)
    assert total() == truth() == 33

    # Concurrent writers of one definition: each holds its transaction open until all have written, which
    # would deadlock (barrier timeout) if the count were one row that every writer updates.
    barrier, errors = threading.Barrier(4, timeout=30), []

    def writer(ids):
        try:
            with fake_app.app_context(), db.product_session("default") as session:
                session.execute(update(R).where(R.c.id.in_(ids)).values(version=R.c.version + 1))
                barrier.wait()
                session.commit()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(bulk_ids[i::4][:5],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert total() == truth() == 13
    embed(*bulk_ids)
    assert total() == truth() == 33

    # A rolled-back write leaves the count as it was (its deltas go with it)
    with fake_app.app_context(), db.product_session("default") as session:
        session.execute(update(R).where(R.c.id.in_(bulk_ids)).values(is_active=False))
        assert session.scalar(select(func.sum(C.c.n)).where(C.c.entity_id == entity_id)) == 3
        session.rollback()
    assert total() == truth() == 33

    # Compaction keeps the sum: the key's delta rows become one row
    q = '"' + schema_for("default") + '"'
    with fake_app.app_context(), db.product_session("default") as session:
        session.execute(text(f"SELECT {q}.entity_embedded_counts_compact(:e, h) FROM (SELECT DISTINCT embedded_hash "
                             f"AS h FROM {q}.entity_embedded_counts WHERE entity_id = :e) AS k"), {"e": entity_id})
        session.commit()
        rows = session.execute(select(C.c.n).where(C.c.entity_id == entity_id)).scalars().all()
    assert rows == [33]
    assert total() == truth() == 33

    # A record written already stamped (COPY, a restore) counts from its insert
    restored = str(uuid.uuid4())
    with fake_app.app_context(), db.product_session("default") as session:
        vector = session.execute(select(E).where(E.c.record_id == bulk_ids[0])).mappings().one()
        session.execute(R.insert().values(id=restored, org_id=org_id, entity_id=entity_id, name="restored",
                                          fields={"body": "restored", "rating": 0}, version=3, is_active=True,
                                          embedded_hash=vector["config_hash"], embedded_version=3))
        session.execute(E.insert().values({**vector, "record_id": restored, "record_version": 3}))
    assert total() == truth() == 34


def test_an_index_walk_in_autocommit_has_its_settings(make_app, fake, auth, org_id):
    """A `$similar` query runs in autocommit (no transaction for SET LOCAL): the walk's settings are set
    at session level, once per connection and values, and must be in force when the page runs."""
    from sqlalchemy import event

    from app.db import db

    headers = auth()
    fake_app, client, entity_id = embedded_remote(make_app, fake, headers, org_id, {**ENABLED, "dimensions": 384},
                                                  EMBEDDINGS_EXACT_SEARCH_MAX_ROWS=0)
    with fake_app.app_context():
        engine = db.engine
    pages, set_calls = [], []

    def before(conn, _cursor, statement, *_args):
        dbapi = conn.connection.dbapi_connection
        if "set_config" in statement:
            set_calls.append(statement)
        if "similar_candidates" in statement:
            with dbapi.cursor() as cur:
                cur.execute("SELECT current_setting('hnsw.iterative_scan'), current_setting('hnsw.ef_search')")
                pages.append((dbapi.autocommit, *cur.fetchone()))

    event.listen(engine, "before_cursor_execute", before)
    try:
        results = [similar(client, headers, "remote", "automobile", pageSize=page_size)
                   for page_size in (3, 3, 150)]
    finally:
        event.remove(engine, "before_cursor_execute", before)
    assert pages == [(True, "relaxed_order", "100")] * 2 + [(True, "relaxed_order", "150")]
    assert 2 <= len(set_calls) <= 3  # the second page, same values on the same pooled connection: nothing sent
    assert [r["totalCount"] for r in results] == [5, 5, 5]
    assert [r["id"] for r in results[0]["records"]] == [r["id"] for r in results[2]["records"]][:3]


def test_a_filtered_index_walk_reads_the_index_whatever_the_planner_estimates(make_app, fake, auth, org_id):
    """Once the app chose the index walk for a filtered `$similar` page (from the exact number of
    matches), the statement walks the HNSW index: the planner's own estimate of the filtered join
    (in the 100k bench an estimate of 231 for 10 000 matches; here, on a few rows, index reads made
    dear) cannot turn it into a filter-first plan with a sort over every match.
    The plan is EXPLAINed on the connection and with the settings the page runs with, past psycopg's
    prepare threshold; sorting is enabled again for every other statement."""
    from sqlalchemy import event

    from app.db import db

    headers = auth()
    fake_app, client, entity_id = embedded_remote(make_app, fake, headers, org_id, {**ENABLED, "dimensions": 384},
                                                  EMBEDDINGS_EXACT_SEARCH_MAX_ROWS=0)
    with fake_app.app_context():
        engine = db.engine
    plans, sorting = [], set()

    def before(conn, _cursor, statement, parameters, *_args):
        dbapi = conn.connection.dbapi_connection
        with dbapi.cursor() as cur:
            # a few rows make any plan cheap: index reads made dear stand in for a far too low estimate
            # of the matches (this app's connections only)
            cur.execute("SET random_page_cost = 1000000")
            if "similar_candidates" in statement:
                cur.execute("EXPLAIN " + statement, parameters)
                plans.append("\n".join(row[0] for row in cur.fetchall()))
            elif "enable_sort" not in statement:
                cur.execute("SELECT current_setting('enable_sort')")
                sorting.add(cur.fetchone()[0])

    event.listen(engine, "before_cursor_execute", before)
    try:
        results = [similar(client, headers, "remote", "automobile", filters={"category": "food"}, pageSize=3)
                   for _ in range(8)]
        results.append(similar(client, headers, "remote", "automobile", filters={"category": "food"},
                               page=2, pageSize=1))
    finally:
        event.remove(engine, "before_cursor_execute", before)
    assert len(plans) == 9
    assert all("ix_entity_embeddings_hnsw_384" in plan for plan in plans), plans[-1]
    assert sorting == {"on"}
    assert [r["totalCount"] for r in results] == [2] * 9
    assert [len(r["records"]) for r in results] == [2] * 8 + [1]
    assert all(r["category"] == "food" for result in results for r in (x["fields"] for x in result["records"]))


def test_a_planned_count_of_similar_with_a_projected_filter_is_estimated_on_the_projection(make_app, fake, auth,
                                                                                          org_id):
    """`Prefer: count=planned` with `$similar` and a filter the typed projection answers: the estimate
    (which also decides exact scan or index walk) is the planner's on the projection's columns, not on
    entity_records joined with the vectors (blind to org_id and entity_id being correlated: 231
    estimated for 10 000 matching in the 100k bench, which sent the page to an exact scan)."""
    from app.db import db
    from app.entities import indexes
    from app.entities.models import EntityDefinition
    from tests.functional.test_entities_projection import statements

    headers = auth()
    fake_app, client, entity_id = embedded_remote(make_app, fake, headers, org_id, {**ENABLED, "dimensions": 16},
                                                  ENTITY_INDEX_MIN_RECORDS=3)
    with fake_app.app_context():
        indexes.sync_definition("default", entity_id)
        with db.product_session("default") as session:
            table = session.get(EntityDefinition, entity_id).projection
    assert table
    for prefer in ("count=planned", "count=estimated"):
        with statements(fake_app) as seen:
            resp = client.post(f"{BASE}/remote/records/query", headers={**headers, "Prefer": prefer},
                               json={"query": {"filters": {"$similar": "automobile", "category": "food"}}})
        assert resp.status_code == 200, resp.get_json()
        assert sorted(r["name"] for r in resp.get_json()["records"]) == ["Chocolate cake", "Sourdough bread recipe"]
        estimates = [s for s in seen if s.startswith("EXPLAIN")]
        assert len(estimates) == 1 and table in estimates[0] and "entity_embeddings" not in estimates[0], seen


def test_filtered_total_count_from_the_projection_stays_exact(make_app, fake, auth, org_id):
    """`$similar` + a filter the definition's typed projection answers counts on the projection (its
    `embedded_current` column, kept by the projection's triggers from v0003's stamp): it must equal the
    join with the vectors after insert, re-embedding, a stale update, a deactivation, a hard delete and a
    vector lost; a filter the projection cannot answer, or a projection of an older plan, counts on
    entity_records as before."""
    from sqlalchemy import delete, func, text

    from app.db import db, schema_for
    from app.embeddings.models import EntityEmbedding
    from app.embeddings.tasks import embed_records
    from app.entities import indexes, projection
    from app.entities.models import EntityDefinition, EntityRecord
    from tests.functional.test_entities_projection import statements

    headers = auth()
    fake_app, client, entity_id = remote_definition(make_app, fake, headers, {**ENABLED, "dimensions": 16},
                                                    ENTITY_INDEX_MIN_RECORDS=3)
    R, E = EntityRecord.__table__, EntityEmbedding.__table__
    records = [create_record(client, headers, "remote", t) for t in TOPICS]  # insert
    with fake_app.app_context():
        indexes.sync_definition("default", entity_id)
        with db.product_session("default") as session:
            table = session.get(EntityDefinition, entity_id).projection
    assert table and table.startswith(projection.PREFIX)

    def truth(category) -> int:  # joined with the vectors, as the page does
        with fake_app.app_context(), db.product_session("default") as session:
            return session.scalar(select(func.count()).select_from(R.join(E, E.c.record_id == R.c.id)).where(
                R.c.org_id == org_id, R.c.entity_id == entity_id, R.c.is_active.is_(True),
                E.c.record_version == R.c.version, R.c.fields["category"].astext == category))

    def total(category, extra=None) -> int:
        flt = {"category": category, **(extra or {})}
        with statements(fake_app) as seen:
            resp = client.post(f"{BASE}/remote/records/query", headers={**headers, "Prefer": "count=exact"},
                               json={"query": {"filters": {"$similar": "automobile", **flt}, "pageSize": 100}})
        assert resp.status_code == 200 and resp.headers["Preference-Applied"] == "count=exact"
        result = resp.get_json()
        counted_on_projection = any("count(" in s and table in s and projection.CURRENT_VECTOR in s for s in seen)
        assert counted_on_projection is (extra is None)
        assert result["totalCount"] == len(result["records"])
        return result["totalCount"]

    def check(expected_food: int) -> None:
        assert total("food") == truth("food") == expected_food
        assert total("vehicles") == truth("vehicles")
        # not projected ($exists): counted on entity_records, the same number
        assert total("food", {"body": {"$exists": True}}) == expected_food

    def embed(*ids):
        assert run_task(fake_app, embed_records, "default", org_id, entity_id, list(ids)).successful()

    def sql(statement):
        with fake_app.app_context(), db.product_session("default") as session:
            session.execute(statement)

    food = [r for r, t in zip(records, TOPICS, strict=True) if t["fields"]["category"] == "food"]
    check(0)
    embed(*[r["id"] for r in records])
    check(2)
    resp = client.put(f"{BASE}/remote/records/{food[0]['id']}", headers=headers,  # stale until re-embedded
                      json={"fields": {"body": "A rocket launch carries a satellite into orbit."}})
    assert resp.status_code == 200
    check(1)
    embed(food[0]["id"])
    check(2)
    embed(food[0]["id"])  # redelivered: unchanged
    check(2)
    assert client.delete(f"{BASE}/remote/records/{food[1]['id']}", headers=headers).status_code in (200, 204)
    check(1)  # deactivated
    sql(delete(E).where(E.c.record_id == food[0]["id"]))  # a vector lost
    check(0)
    embed(food[0]["id"])
    check(1)
    sql(delete(R).where(R.c.id == food[0]["id"]))  # hard delete
    check(0)
    assert total("vehicles") == truth("vehicles") == 1

    # a projection of an older plan (no embedded_current column): the definition no longer points at
    # it, so the count is the entity_records one, still exact
    q = '"' + schema_for("default") + '"'
    with fake_app.app_context(), db.product_session("default") as session:
        session.execute(text(f"UPDATE {q}.entity_definitions SET projection = NULL WHERE id = :d"), {"d": entity_id})
    resp = client.post(f"{BASE}/remote/records/query", headers={**headers, "Prefer": "count=exact"},
                       json={"query": {"filters": {"$similar": "automobile", "category": "vehicles"}}})
    assert resp.status_code == 200 and resp.get_json()["totalCount"] == 1
