"""The asynchronous client (`AsyncClient`) and its resources, one per area of the API.

This module is the only client written by hand: `_sync.py` (`Client`) is generated from it by
tools/codegen.py, so both have the same resources, methods, retries and paging. What they share without
I/O (building requests, retry decisions, errors) lives in `_core.py`.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect  # async-only
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, cast

import httpx

from platform_gateway_client import _core, errors
from platform_gateway_client._core import (
    DEFAULT_TIMEOUT,
    EMAIL_JOB_DONE,
    IMAGE_TIMEOUT,
    JOB_DONE,
    ROLLOUT_DONE,
    SEED_DONE,
    AsyncSleep,
    AsyncTokenProvider,
    Call,
    RetryPolicy,
    Tagged,
    conditional_headers,
)
from platform_gateway_client.models import (
    AdminUpsertResult,
    Agent,
    AgentAnalyticsListResponse,
    AgentInput,
    AgentInputPatch,
    AgentList,
    AgentSummary,
    AgentSummaryList,
    AggregateField,
    AggregateResponse,
    AnalyticsEvent,
    AnalyticsEventOut,
    AnalyticsEventOutListResponse,
    AnalyticsSeriesResponse,
    AnalyticsSummaryResponse,
    ArtifactList,
    BatchAccepted,
    BulkMessage,
    BulkResult,
    ChannelAnalyticsListResponse,
    ChannelDailyListResponse,
    ChatAnalytics,
    ChatAnalyticsListResponse,
    DailyAnalyticsListResponse,
    Definition,
    DefinitionCreate,
    DefinitionInput,
    Delivery,
    DeliveryList,
    EmailJob,
    EmailJobAccepted,
    GlobalAnalyticsSummaryResponse,
    GlobalChannelSummaryListResponse,
    Health,
    Identity,
    ImageResult,
    IssueList,
    JobAccepted,
    LookupInclude,
    Mask,
    OrgAnalyticsListResponse,
    OrgChannelAnalyticsListResponse,
    Outcome,
    PaginatedResult,
    Publish,
    Published,
    Record,
    RecordInput,
    ReferenceImage,
    Relationship,
    RelationshipInput,
    Rollout,
    RolloutDetail,
    RolloutList,
    SeedAdmin,
    SeedOrg,
    SeedQueued,
    SeedReport,
    SeedStatus,
    SendEmailResponse,
    Skill,
    SkillInput,
    SkillInputPatch,
    SkillList,
    SubAgent,
    SubAgentFields,
    SubAgentFieldsPatch,
    SubAgentList,
    Subscriber,
    SubscriberList,
    Success,
    ToolDefinition,
    ToolDefinitionFields,
    ToolDefinitionFieldsPatch,
    ToolDefinitionList,
    Unsubscribed,
    UsageAnalyticsListResponse,
    View,
    Widget,
    WidgetFields,
    WidgetFieldsPatch,
    WidgetList,
)
from platform_gateway_client.models import Job as JobStatus

SortOrder = Literal["asc", "desc", 1, -1]
CountMode = Literal["exact", "planned", "estimated"]
Interval = Literal["day", "week", "month"]


def _sort_order(value: SortOrder | None) -> int | None:
    """The wire's 1 / -1 for the client-level `asc` / `desc` (numbers pass through)."""
    if value is None:
        return None
    if value in ("asc", 1):
        return 1
    if value in ("desc", -1):
        return -1
    raise ValueError(f"sort_order must be 'asc', 'desc', 1 or -1, not {value!r}")


def _seed_finished(status: Mapping[str, Any]) -> bool:
    last = status.get("lastRequest")
    if last is not None:
        return last.get("status") in SEED_DONE
    summary = status.get("summary") or {}
    return bool(summary.get("total")) and summary.get("missing") == 0


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class AsyncClient:
    """The Platform Gateway API, asynchronously (httpx.AsyncClient).

        async with AsyncClient("https://gateway.example.com", token=lambda: tokens.current()) as api:
            me = await api.me()
            async for agent in api.agents.iter():
                ...

    - `token`: a bearer token, or a callable returning the current one. It is
      asked before every request, and once more after a 401 (the request is repeated once when it gives
      another token): the place to refresh.
    - `retry`: `RetryPolicy` (default: 3 retries, backoff 0.5 s doubling to 8 s with full jitter, honouring
      Retry-After up to 60 s); `RetryPolicy(max_retries=0)` turns retries off.
    - `internal_token`: the `X-Internal-Token` of /internal/* (seeding), when not calling as an admin.
    - `http`: an httpx.AsyncClient of yours (its base_url is the API's); `transport`, `timeout`, `headers`
      configure the one this client makes otherwise. `sleep` replaces the waits between retries and polls.
    """

    def __init__(self, base_url: str = "http://localhost:8000", *, token: str | AsyncTokenProvider | None = None,
                 retry: RetryPolicy | None = None, timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
                 headers: Mapping[str, str] | None = None, internal_token: str | None = None,
                 http: httpx.AsyncClient | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 sleep: AsyncSleep | None = None) -> None:
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport)
        self._token_source = token
        self._retry = retry or RetryPolicy()
        self._headers = dict(headers or {})
        if internal_token:
            self._headers["X-Internal-Token"] = internal_token
        self._sleep: AsyncSleep = sleep if sleep is not None else asyncio.sleep
        self.images = AsyncImages(self)
        self.agents = AsyncAgents(self)
        self.skills = AsyncSkills(self)
        self.tools = AsyncTools(self)
        self.subagents = AsyncSubAgents(self)
        self.widgets = AsyncWidgets(self)
        self.entities = AsyncEntities(self)
        self.jobs = AsyncJobs(self)
        self.analytics = AsyncAnalytics(self)
        self.email = AsyncEmail(self)
        self.newsletter = AsyncNewsletter(self)
        self.admin = AsyncAdmin(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (only when this client made it)."""
        if self._own_http:
            await self._http.aclose()

    # -- the request loop ----------------------------------------------------------------------------------
    async def _token(self) -> str | None:
        # (AsyncClient also takes a coroutine function as its token provider)  # async-only
        value: Any = self._token_source() if callable(self._token_source) else self._token_source
        if inspect.isawaitable(value):  # async-only
            value = await value  # async-only
        return cast("str | None", value)

    async def send(self, call: Call) -> httpx.Response:
        """Send one logical call: retries (RetryPolicy) and one token refresh after a 401 included.
        Answers of status < 400 (304 too) are returned; errors are raised as `errors.ApiError` subclasses,
        and no answer at all as `errors.TransportError`."""
        retry, refreshed = 0, False
        token = await self._token()
        while True:
            request = _core.build_request(self._http, call, token, self._headers)
            try:
                response = await self._http.send(request)
            except httpx.TransportError as exc:
                delay = _core.retry_delay(self._retry, call, retry, exc=exc)
                if delay is None:
                    raise errors.TransportError(f"{call.method} {call.path}: {type(exc).__name__}: {exc}") from exc
                await self._sleep(delay)
                retry += 1
                token = await self._token()
                continue
            if response.status_code < 400:
                return response
            if response.status_code == 401 and callable(self._token_source) and not refreshed:
                refreshed = True
                fresh = await self._token()
                if fresh != token:  # the provider refreshed: repeat once with the new token
                    token = fresh
                    continue
            delay = _core.retry_delay(self._retry, call, retry, response=response)
            if delay is None:
                raise _core.api_error(response)
            await self._sleep(delay)
            retry += 1
            token = await self._token()

    async def request(self, call: Call) -> Any:
        """`send`, then the answer's JSON."""
        return _core.decode(await self.send(call))

    async def request_tagged(self, call: Call) -> Tagged[Any]:
        """`send`, then the answer's JSON with its ETag (a 304 gives `not_modified=True`, no value)."""
        response = await self.send(call)
        etag = response.headers.get("ETag")
        if response.status_code == 304:
            return Tagged(None, etag or call.headers.get("If-None-Match"), True)
        return Tagged(_core.decode(response), etag)

    async def wait_for(self, call: Call, finished: Any, *, timeout: float, poll_interval: float,
                       max_poll_interval: float = 5.0) -> Any:
        """Read a status document (`call`) until `finished(document)` is true, sleeping `poll_interval`
        between reads (growing by half up to `max_poll_interval`); WaitTimeoutError after `timeout` s."""
        deadline = _core.monotonic() + timeout
        delays = _core.poll_delays(poll_interval, max_poll_interval)
        while True:
            document = await self.request(call)
            if finished(document):
                return document
            delay = delays()
            if _core.monotonic() + delay > deadline:
                raise errors.WaitTimeoutError(f"{call.path} not finished after {timeout} s", document)
            await self._sleep(delay)

    # -- identity and health -------------------------------------------------------------------------------
    async def me(self) -> Identity:
        """Who the token says the caller is (org, user, product, scopes)."""
        return cast(Identity, await self.request(Call("GET", "/api/v1/me")))

    async def health(self) -> Health:
        """The service's health (no token needed; 503 raises ServiceUnavailableError)."""
        return cast(Health, await self.request(Call("GET", "/health", auth=False)))


class AsyncResource:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def _pages(self, method: str, template: str, key: str, params: dict[str, Any],
                     path_params: Mapping[str, str] | None = None,
                     cursor_param: str = "cursor") -> AsyncIterator[Any]:
        """Every item of a list paged by `nextCursor` (sent back as `cursor_param`)."""
        params = dict(params)
        while True:
            page = await self._client.request(Call(method, template, path_params or {}, params=params))
            for item in page[key]:
                yield item
            cursor = page.get("nextCursor")
            if cursor is None:
                return
            params[cursor_param] = cursor


# -- images ------------------------------------------------------------------------------------------------

class AsyncImages(AsyncResource):
    async def generate(self, *, provider: str, model: str, prompt: str, size: str | None = None,
                       quality: str | None = None, style: str | None = None,
                       negative_prompt: str | None = None, reference_image: ReferenceImage | None = None,
                       mask: Mask | None = None, idempotency_key: str | None = None) -> ImageResult:
        """One image (`POST /api/v1/agents/images`, scope `write:image-gen`); edit mode with
        `reference_image` (and, provider-a general model only, a PNG `mask`). Waits up to the gateway's
        budget (120 s)."""
        body = _drop_none({"provider": provider, "model": model, "prompt": prompt, "size": size,
                           "quality": quality, "style": style, "negativePrompt": negative_prompt,
                           "referenceImage": reference_image, "mask": mask})
        answer = await self._client.request(Call("POST", "/api/v1/agents/images", json=body, idempotent_post=True,
                                                 idempotency_key=idempotency_key, timeout=IMAGE_TIMEOUT))
        return cast(ImageResult, answer["data"])


# -- agent registry ------------------------------------------------------------------------------------------

class AsyncAgents(AsyncResource):
    async def list(self, *, limit: int | None = None, cursor: str | None = None, status: str | None = None,
                   type: str | None = None, is_default: bool | None = None) -> AgentList:
        """One page of agents by name (`nextCursor` is the next page's `cursor`)."""
        params = {"limit": limit, "cursor": cursor, "status": status, "type": type, "isDefault": is_default}
        return cast(AgentList, await self._client.request(Call("GET", "/api/v1/agents", params=params)))

    async def iter(self, *, page_size: int | None = None, status: str | None = None, type: str | None = None,
                   is_default: bool | None = None) -> AsyncIterator[Agent]:
        """Every agent (following `nextCursor`)."""
        params = {"limit": page_size, "status": status, "type": type, "isDefault": is_default}
        pages = self._pages("GET", "/api/v1/agents", "agents", params)
        async for item in pages:
            yield item

    async def summary(self, *, limit: int | None = None, cursor: str | None = None, status: str | None = None,
                      type: str | None = None, is_default: bool | None = None) -> AgentSummaryList:
        params = {"limit": limit, "cursor": cursor, "status": status, "type": type, "isDefault": is_default}
        return cast(AgentSummaryList, await self._client.request(Call("GET", "/api/v1/agents/summary",
                                                                      params=params)))

    async def iter_summary(self, *, page_size: int | None = None, status: str | None = None,
                           type: str | None = None, is_default: bool | None = None) -> AsyncIterator[AgentSummary]:
        params = {"limit": page_size, "status": status, "type": type, "isDefault": is_default}
        pages = self._pages("GET", "/api/v1/agents/summary", "agents", params)
        async for item in pages:
            yield item

    async def get(self, agent_id: str) -> Agent:
        answer = await self._client.request(Call("GET", "/api/v1/agents/{agentId}", {"agentId": agent_id}))
        return cast(Agent, answer["agent"])

    async def get_tagged(self, agent_id: str, *, if_none_match: str | None = None) -> Tagged[Agent]:
        """The agent with its ETag; with `if_none_match`, `not_modified=True` when it has not changed."""
        tagged = await self._client.request_tagged(Call("GET", "/api/v1/agents/{agentId}", {"agentId": agent_id},
                                                        headers=conditional_headers(if_none_match=if_none_match)))
        return Tagged(tagged.value["agent"] if tagged.value else None, tagged.etag, tagged.not_modified)

    async def by_name(self, name: str) -> Agent:
        answer = await self._client.request(Call("GET", "/api/v1/agents/by-name", params={"name": name}))
        return cast(Agent, answer["agent"])

    async def default(self) -> Agent:
        """The organization's default agent (NotFoundError when there is none)."""
        answer = await self._client.request(Call("GET", "/api/v1/agents/default"))
        return cast(Agent, answer["agent"])

    async def create(self, agent: AgentInput, *, idempotency_key: str | None = None) -> Agent:
        answer = await self._client.request(Call("POST", "/api/v1/agents", json=agent, idempotent_post=True,
                                                 idempotency_key=idempotency_key))
        return cast(Agent, answer["agent"])

    async def update(self, agent_id: str, patch: AgentInputPatch, *, if_match: str | None = None) -> Agent:
        """Change the given fields; with `if_match` (an ETag), PreconditionFailedError if it changed since."""
        return (await self.update_tagged(agent_id, patch, if_match=if_match)).unwrap()

    async def update_tagged(self, agent_id: str, patch: AgentInputPatch, *,
                            if_match: str | None = None) -> Tagged[Agent]:
        tagged = await self._client.request_tagged(Call("PUT", "/api/v1/agents/{agentId}", {"agentId": agent_id},
                                                        json=patch, headers=conditional_headers(if_match)))
        return Tagged(tagged.value["agent"] if tagged.value else None, tagged.etag)

    async def delete(self, agent_id: str, *, if_match: str | None = None) -> Success:
        return cast(Success, await self._client.request(Call("DELETE", "/api/v1/agents/{agentId}",
                                                             {"agentId": agent_id},
                                                             headers=conditional_headers(if_match))))

    async def export(self, agent_id: str) -> Agent:
        """The agent as a self-contained document that `import_` takes (in any organization)."""
        answer = await self._client.request(Call("GET", "/api/v1/agents/{agentId}/export", {"agentId": agent_id}))
        return cast(Agent, answer["agent"])

    async def import_(self, agent: AgentInput | Agent, *, overwrite: bool = False,
                      idempotency_key: str | None = None) -> Agent:
        """Import an exported agent (ConflictError when the name is taken, unless `overwrite`)."""
        answer = await self._client.request(Call("POST", "/api/v1/agents/import", json=agent,
                                                 params={"overwrite": overwrite or None}, idempotent_post=True,
                                                 idempotency_key=idempotency_key))
        return cast(Agent, answer["agent"])


class AsyncSkills(AsyncResource):
    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> SkillList:
        return cast(SkillList, await self._client.request(Call("GET", "/api/v1/skills",
                                                               params={"limit": limit, "cursor": cursor})))

    async def iter(self, *, page_size: int | None = None) -> AsyncIterator[Skill]:
        pages = self._pages("GET", "/api/v1/skills", "skills", {"limit": page_size})
        async for item in pages:
            yield item

    async def get(self, skill_id: str) -> Skill:
        answer = await self._client.request(Call("GET", "/api/v1/skills/{skillId}", {"skillId": skill_id}))
        return cast(Skill, answer["skill"])

    async def by_name(self, name: str) -> Skill:
        answer = await self._client.request(Call("GET", "/api/v1/skills/by-name", params={"name": name}))
        return cast(Skill, answer["skill"])

    async def get_tagged(self, name: str, *, if_none_match: str | None = None) -> Tagged[Skill]:
        """The skill (by name, as writes address it) with its ETag; `not_modified=True` when unchanged."""
        tagged = await self._client.request_tagged(Call("GET", "/api/v1/skills/by-name", params={"name": name},
                                                        headers=conditional_headers(if_none_match=if_none_match)))
        return Tagged(tagged.value["skill"] if tagged.value else None, tagged.etag, tagged.not_modified)

    async def categories(self) -> builtins.list[str]:
        return cast("list[str]", await self._client.request(Call("GET", "/api/v1/skills/categories")))

    async def create(self, skill: SkillInput, *, idempotency_key: str | None = None) -> Skill:
        answer = await self._client.request(Call("POST", "/api/v1/skills", json=skill, idempotent_post=True,
                                                 idempotency_key=idempotency_key))
        return cast(Skill, answer["skill"])

    async def update(self, name: str, patch: SkillInputPatch, *, if_match: str | None = None) -> Skill:
        """Catalog skills are addressed by name for writes; `if_match`: PreconditionFailedError if changed."""
        answer = await self._client.request(Call("PUT", "/api/v1/skills/by-name", params={"name": name},
                                                 json=patch, headers=conditional_headers(if_match)))
        return cast(Skill, answer["skill"])

    async def delete(self, name: str, *, if_match: str | None = None) -> Success:
        return cast(Success, await self._client.request(Call("DELETE", "/api/v1/skills/by-name",
                                                             params={"name": name},
                                                             headers=conditional_headers(if_match))))


class AsyncTools(AsyncResource):
    """Tool definitions (`/api/v1/tool-definitions`)."""

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> ToolDefinitionList:
        return cast(ToolDefinitionList, await self._client.request(
            Call("GET", "/api/v1/tool-definitions", params={"limit": limit, "cursor": cursor})))

    async def iter(self, *, page_size: int | None = None) -> AsyncIterator[ToolDefinition]:
        pages = self._pages("GET", "/api/v1/tool-definitions", "toolDefinitions", {"limit": page_size})
        async for item in pages:
            yield item

    async def get(self, tool_id: str) -> ToolDefinition:
        answer = await self._client.request(Call("GET", "/api/v1/tool-definitions/{toolDefId}",
                                                 {"toolDefId": tool_id}))
        return cast(ToolDefinition, answer["toolDefinition"])

    async def get_tagged(self, tool_id: str, *, if_none_match: str | None = None) -> Tagged[ToolDefinition]:
        tagged = await self._client.request_tagged(Call("GET", "/api/v1/tool-definitions/{toolDefId}",
                                                        {"toolDefId": tool_id},
                                                        headers=conditional_headers(if_none_match=if_none_match)))
        return Tagged(tagged.value["toolDefinition"] if tagged.value else None, tagged.etag, tagged.not_modified)

    async def by_ids(self, ids: Sequence[str]) -> builtins.list[ToolDefinition]:
        """The tool definitions among `ids` (unknown ids are absent)."""
        answer = await self._client.request(Call("POST", "/api/v1/tool-definitions/by-ids", json={"ids": list(ids)},
                                                 safe=True))
        return cast("list[ToolDefinition]", answer["toolDefinitions"])

    async def create(self, tool: ToolDefinitionFields, *, idempotency_key: str | None = None) -> ToolDefinition:
        answer = await self._client.request(Call("POST", "/api/v1/tool-definitions", json={"toolDefinition": tool},
                                                 idempotent_post=True, idempotency_key=idempotency_key))
        return cast(ToolDefinition, answer["toolDefinition"])

    async def update(self, tool_id: str, patch: ToolDefinitionFieldsPatch, *,
                     if_match: str | None = None) -> ToolDefinition:
        answer = await self._client.request(Call("PUT", "/api/v1/tool-definitions/{toolDefId}",
                                                 {"toolDefId": tool_id}, json={"toolDefinition": patch},
                                                 headers=conditional_headers(if_match)))
        return cast(ToolDefinition, answer["toolDefinition"])

    async def delete(self, tool_id: str, *, if_match: str | None = None) -> Success:
        return cast(Success, await self._client.request(Call("DELETE", "/api/v1/tool-definitions/{toolDefId}",
                                                             {"toolDefId": tool_id},
                                                             headers=conditional_headers(if_match))))


class AsyncSubAgents(AsyncResource):
    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> SubAgentList:
        return cast(SubAgentList, await self._client.request(Call("GET", "/api/v1/subagents",
                                                                  params={"limit": limit, "cursor": cursor})))

    async def iter(self, *, page_size: int | None = None) -> AsyncIterator[SubAgent]:
        pages = self._pages("GET", "/api/v1/subagents", "subAgents", {"limit": page_size})
        async for item in pages:
            yield item

    async def get(self, sub_agent_id: str) -> SubAgent:
        answer = await self._client.request(Call("GET", "/api/v1/subagents/{subAgentId}",
                                                 {"subAgentId": sub_agent_id}))
        return cast(SubAgent, answer["subAgent"])

    async def get_tagged(self, sub_agent_id: str, *, if_none_match: str | None = None) -> Tagged[SubAgent]:
        tagged = await self._client.request_tagged(Call("GET", "/api/v1/subagents/{subAgentId}",
                                                        {"subAgentId": sub_agent_id},
                                                        headers=conditional_headers(if_none_match=if_none_match)))
        return Tagged(tagged.value["subAgent"] if tagged.value else None, tagged.etag, tagged.not_modified)

    async def create(self, sub_agent: SubAgentFields, *, idempotency_key: str | None = None) -> SubAgent:
        answer = await self._client.request(Call("POST", "/api/v1/subagents", json={"subAgent": sub_agent},
                                                 idempotent_post=True, idempotency_key=idempotency_key))
        return cast(SubAgent, answer["subAgent"])

    async def update(self, sub_agent_id: str, patch: SubAgentFieldsPatch, *,
                     if_match: str | None = None) -> SubAgent:
        answer = await self._client.request(Call("PUT", "/api/v1/subagents/{subAgentId}",
                                                 {"subAgentId": sub_agent_id}, json={"subAgent": patch},
                                                 headers=conditional_headers(if_match)))
        return cast(SubAgent, answer["subAgent"])

    async def delete(self, sub_agent_id: str, *, force: bool = False, if_match: str | None = None) -> Success:
        """ConflictError while agents reference it, unless `force`."""
        return cast(Success, await self._client.request(Call("DELETE", "/api/v1/subagents/{subAgentId}",
                                                             {"subAgentId": sub_agent_id},
                                                             params={"force": force or None},
                                                             headers=conditional_headers(if_match))))


class AsyncWidgets(AsyncResource):
    async def list(self, agent_id: str, *, limit: int | None = None, cursor: str | None = None) -> WidgetList:
        return cast(WidgetList, await self._client.request(Call("GET", "/api/v1/agents/{agentId}/widgets",
                                                                {"agentId": agent_id},
                                                                params={"limit": limit, "cursor": cursor})))

    async def iter(self, agent_id: str, *, page_size: int | None = None) -> AsyncIterator[Widget]:
        pages = self._pages("GET", "/api/v1/agents/{agentId}/widgets", "widgets", {"limit": page_size},
                            {"agentId": agent_id})
        async for item in pages:
            yield item

    async def default(self, agent_id: str) -> Widget:
        answer = await self._client.request(Call("GET", "/api/v1/agents/{agentId}/widgets/default",
                                                 {"agentId": agent_id}))
        return cast(Widget, answer["widget"])

    async def create(self, agent_id: str, widget: WidgetFields, *, idempotency_key: str | None = None) -> Widget:
        answer = await self._client.request(Call("POST", "/api/v1/agents/{agentId}/widgets", {"agentId": agent_id},
                                                 json={"widget": widget}, idempotent_post=True,
                                                 idempotency_key=idempotency_key))
        return cast(Widget, answer["widget"])

    async def get(self, widget_id: str) -> Widget:
        answer = await self._client.request(Call("GET", "/api/v1/widgets/{widgetId}", {"widgetId": widget_id}))
        return cast(Widget, answer["widget"])

    async def get_tagged(self, widget_id: str, *, if_none_match: str | None = None) -> Tagged[Widget]:
        tagged = await self._client.request_tagged(Call("GET", "/api/v1/widgets/{widgetId}", {"widgetId": widget_id},
                                                        headers=conditional_headers(if_none_match=if_none_match)))
        return Tagged(tagged.value["widget"] if tagged.value else None, tagged.etag, tagged.not_modified)

    async def update(self, widget_id: str, patch: WidgetFieldsPatch, *, if_match: str | None = None) -> Widget:
        answer = await self._client.request(Call("PUT", "/api/v1/widgets/{widgetId}", {"widgetId": widget_id},
                                                 json={"widget": patch}, headers=conditional_headers(if_match)))
        return cast(Widget, answer["widget"])

    async def delete(self, widget_id: str, *, if_match: str | None = None) -> Success:
        return cast(Success, await self._client.request(Call("DELETE", "/api/v1/widgets/{widgetId}",
                                                             {"widgetId": widget_id},
                                                             headers=conditional_headers(if_match))))

    async def set_default(self, widget_id: str, agent_id: str) -> Success:
        """Make this widget its agent's default (the previous default stops being one)."""
        return cast(Success, await self._client.request(Call("POST", "/api/v1/widgets/{widgetId}/default",
                                                             {"widgetId": widget_id}, json={"agentId": agent_id},
                                                             idempotent_post=True)))


# -- entity store --------------------------------------------------------------------------------------------

class AsyncDefinitions(AsyncResource):
    async def list(self, *, module: str | None = None, status: str | None = None) -> builtins.list[Definition]:
        """Every definition (optionally of one `module` / `status`), all pages."""
        return [item async for item in self.iter(module=module, status=status)]

    async def iter(self, *, module: str | None = None, status: str | None = None,
                   page_size: int | None = None) -> AsyncIterator[Definition]:
        pages = self._pages("GET", "/api/v1/entities/definitions", "definitions",
                            {"module": module, "status": status, "limit": page_size})
        async for item in pages:
            yield cast(Definition, item)

    async def get(self, name: str) -> Definition:
        answer = await self._client.request(Call("GET", "/api/v1/entities/definitions/{entityName}",
                                                 {"entityName": name}))
        return cast(Definition, answer["definition"])

    async def get_tagged(self, name: str, *, if_none_match: str | None = None) -> Tagged[Definition]:
        tagged = await self._client.request_tagged(Call("GET", "/api/v1/entities/definitions/{entityName}",
                                                        {"entityName": name},
                                                        headers=conditional_headers(if_none_match=if_none_match)))
        return Tagged(tagged.value["definition"] if tagged.value else None, tagged.etag, tagged.not_modified)

    async def create(self, definition: DefinitionCreate, *, idempotency_key: str | None = None) -> str:
        """Create a definition; its id."""
        answer = await self._client.request(Call("POST", "/api/v1/entities/definitions", json=definition,
                                                 idempotent_post=True, idempotency_key=idempotency_key))
        return cast(str, answer["id"])

    async def update(self, name: str, patch: DefinitionInput, *, if_match: str | None = None) -> Success:
        return (await self.update_tagged(name, patch, if_match=if_match)).unwrap()

    async def update_tagged(self, name: str, patch: DefinitionInput, *,
                            if_match: str | None = None) -> Tagged[Success]:
        return await self._client.request_tagged(Call("PUT", "/api/v1/entities/definitions/{entityName}",
                                                      {"entityName": name}, json=patch,
                                                      headers=conditional_headers(if_match)))

    async def delete(self, name: str, *, delete_records: bool = False, hard_delete: bool = False,
                     if_match: str | None = None) -> Success:
        params = {"deleteRecords": delete_records or None, "hardDelete": hard_delete or None}
        return cast(Success, await self._client.request(Call("DELETE", "/api/v1/entities/definitions/{entityName}",
                                                             {"entityName": name}, params=params,
                                                             headers=conditional_headers(if_match))))


class AsyncViews(AsyncResource):
    async def list(self, entity: str) -> builtins.list[View]:
        """Every view of the definition, all pages."""
        return [item async for item in self.iter(entity)]

    async def iter(self, entity: str, *, page_size: int | None = None) -> AsyncIterator[View]:
        pages = self._pages("GET", "/api/v1/entities/definitions/{entityName}/views", "views",
                            {"limit": page_size}, {"entityName": entity})
        async for item in pages:
            yield cast(View, item)

    async def create(self, entity: str, view: Mapping[str, Any], *, idempotency_key: str | None = None) -> str:
        """Create a view (ViewCreate); its id."""
        answer = await self._client.request(Call("POST", "/api/v1/entities/definitions/{entityName}/views",
                                                 {"entityName": entity}, json=view, idempotent_post=True,
                                                 idempotency_key=idempotency_key))
        return cast(str, answer["id"])

    async def update(self, entity: str, view_id: str, patch: Mapping[str, Any]) -> Success:
        return cast(Success, await self._client.request(
            Call("PUT", "/api/v1/entities/definitions/{entityName}/views/{viewId}",
                 {"entityName": entity, "viewId": view_id}, json=patch)))

    async def delete(self, entity: str, view_id: str) -> Success:
        return cast(Success, await self._client.request(
            Call("DELETE", "/api/v1/entities/definitions/{entityName}/views/{viewId}",
                 {"entityName": entity, "viewId": view_id})))


class AsyncRecords(AsyncResource):
    async def create(self, entity: str, record: RecordInput, *, idempotency_key: str | None = None) -> Record:
        return cast(Record, await self._client.request(Call("POST", "/api/v1/entities/{entityName}/records",
                                                            {"entityName": entity}, json=record,
                                                            idempotent_post=True, idempotency_key=idempotency_key)))

    async def get(self, entity: str, record_id: str) -> Record:
        return cast(Record, await self._client.request(
            Call("GET", "/api/v1/entities/{entityName}/records/{recordId}",
                 {"entityName": entity, "recordId": record_id})))

    async def get_tagged(self, entity: str, record_id: str, *, if_none_match: str | None = None) -> Tagged[Record]:
        """The record with its ETag; with `if_none_match`, `not_modified=True` when it has not changed."""
        return await self._client.request_tagged(Call("GET", "/api/v1/entities/{entityName}/records/{recordId}",
                                                      {"entityName": entity, "recordId": record_id},
                                                      headers=conditional_headers(if_none_match=if_none_match)))

    async def update(self, entity: str, record_id: str, patch: RecordInput, *,
                     if_match: str | None = None) -> Success:
        """Merge `patch` into the record (`{"fields": {"x": None}}` removes x); with `if_match` (an ETag),
        PreconditionFailedError when the record changed since it was read."""
        return (await self.update_tagged(entity, record_id, patch, if_match=if_match)).unwrap()

    async def update_tagged(self, entity: str, record_id: str, patch: RecordInput, *,
                            if_match: str | None = None) -> Tagged[Success]:
        """`update`, with the record's new ETag."""
        return await self._client.request_tagged(Call("PUT", "/api/v1/entities/{entityName}/records/{recordId}",
                                                      {"entityName": entity, "recordId": record_id}, json=patch,
                                                      headers=conditional_headers(if_match)))

    async def delete(self, entity: str, record_id: str, *, hard_delete: bool = False,
                     if_match: str | None = None) -> Success:
        return cast(Success, await self._client.request(
            Call("DELETE", "/api/v1/entities/{entityName}/records/{recordId}",
                 {"entityName": entity, "recordId": record_id}, params={"hardDelete": hard_delete or None},
                 headers=conditional_headers(if_match))))

    @staticmethod
    def _query_body(filters: Mapping[str, Any] | None, page: int | None, page_size: int | None,
                    sort_by: str | None, sort_order: SortOrder | None, include: Sequence[str] | None,
                    exclude: Sequence[str] | None, include_lookups: Sequence[LookupInclude] | None,
                    cursor: str | None) -> dict[str, Any]:
        return {"query": _drop_none({
            "filters": filters, "page": page, "pageSize": page_size, "sortBy": sort_by,
            "sortOrder": _sort_order(sort_order), "include": list(include) if include is not None else None,
            "exclude": list(exclude) if exclude is not None else None,
            "includeLookups": list(include_lookups) if include_lookups is not None else None, "cursor": cursor})}

    async def query(self, entity: str, *, filters: Mapping[str, Any] | None = None, page: int | None = None,
                    page_size: int | None = None, sort_by: str | None = None, sort_order: SortOrder | None = None,
                    include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                    include_lookups: Sequence[LookupInclude] | None = None, cursor: str | None = None,
                    count: CountMode | None = None) -> PaginatedResult:
        """One page of records (PaginatedResult): filters (`$eq`… `$search`, `$similar`, `$and/$or/$not`),
        sorting (`sort_order` "asc"/"desc"), paging by `page` or by the previous page's `nextCursor`;
        `count="planned"` or `"estimated"` for a cheap approximate `totalCount`."""
        body = self._query_body(filters, page, page_size, sort_by, sort_order, include, exclude,
                                include_lookups, cursor)
        headers = {"Prefer": f"count={count}"} if count else {}
        return cast(PaginatedResult, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/query", {"entityName": entity}, json=body,
                 headers=headers, safe=True)))

    async def iter(self, entity: str, *, filters: Mapping[str, Any] | None = None, page_size: int | None = 100,
                   sort_by: str | None = None, sort_order: SortOrder | None = None,
                   include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                   include_lookups: Sequence[LookupInclude] | None = None,
                   count: CountMode | None = "planned") -> AsyncIterator[Record]:
        """Every matching record, page after page: by `nextCursor` (keyset pages, stable under inserts);
        relevance-ordered results ($similar, ranked $search) have none and are paged by number."""
        cursor: str | None = None
        page: int | None = None
        while True:
            result = await self.query(entity, filters=filters, page=page, page_size=page_size, sort_by=sort_by,
                                      sort_order=sort_order, include=include, exclude=exclude,
                                      include_lookups=include_lookups, cursor=cursor, count=count)
            for record in result["records"]:
                yield record
            if result.get("nextCursor"):
                cursor, page = result["nextCursor"], None
            elif result.get("hasNextPage") and cursor is None:
                page = (result.get("currentPage") or 1) + 1
            else:
                return

    async def count(self, entity: str, filters: Mapping[str, Any] | None = None) -> int:
        return cast(int, await self._client.request(Call("POST", "/api/v1/entities/{entityName}/records/count",
                                                         {"entityName": entity}, json={"filters": filters},
                                                         safe=True)))

    async def aggregate(self, entity: str, aggregates: Sequence[AggregateField], *,
                        filters: Mapping[str, Any] | None = None, group_by: Sequence[str] | None = None,
                        having: Mapping[str, Any] | None = None, sort_by: str | None = None,
                        sort_order: SortOrder | None = None, limit: int | None = None,
                        timezone: str | None = None) -> AggregateResponse:
        """Groups and totals: `group_by` entries may end with `:day`, `:week`…; `sort_by` names an alias."""
        body = _drop_none({"aggregates": list(aggregates), "filters": filters,
                           "groupBy": list(group_by) if group_by is not None else None, "having": having,
                           "sortBy": sort_by, "sortOrder": _sort_order(sort_order), "limit": limit,
                           "timezone": timezone})
        return cast(AggregateResponse, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/aggregate", {"entityName": entity}, json=body,
                 safe=True)))

    async def bulk_create(self, entity: str, records: Sequence[RecordInput], *,
                          idempotency_key: str | None = None) -> BulkResult:
        """Create all of `records` or none (at most 5 000)."""
        return cast(BulkResult, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/bulk/create", {"entityName": entity},
                 json={"records": list(records)}, idempotent_post=True, idempotency_key=idempotency_key)))

    async def bulk_update(self, entity: str, records: Sequence[Mapping[str, Any]], *,
                          idempotency_key: str | None = None) -> BulkResult:
        """Update each record (`{"id": …, "fields": {…}}`), all or nothing."""
        return cast(BulkResult, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/bulk/update", {"entityName": entity},
                 json={"records": list(records)}, idempotent_post=True, idempotency_key=idempotency_key)))

    async def bulk_delete(self, entity: str, record_ids: Sequence[str], *,
                          idempotency_key: str | None = None) -> BulkResult:
        return cast(BulkResult, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/bulk/delete", {"entityName": entity},
                 json={"recordIds": list(record_ids)}, idempotent_post=True, idempotency_key=idempotency_key)))

    async def start_bulk_create(self, entity: str, records: Sequence[RecordInput], *,
                                idempotency_key: str | None = None) -> JobAccepted:
        """`bulk_create` as a background job (`Prefer: respond-async`): `client.jobs.wait(accepted["jobId"])`."""
        return cast(JobAccepted, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/bulk/create", {"entityName": entity},
                 json={"records": list(records)}, headers={"Prefer": "respond-async"}, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def start_bulk_update(self, entity: str, records: Sequence[Mapping[str, Any]], *,
                                idempotency_key: str | None = None) -> JobAccepted:
        return cast(JobAccepted, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/bulk/update", {"entityName": entity},
                 json={"records": list(records)}, headers={"Prefer": "respond-async"}, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def start_bulk_delete(self, entity: str, record_ids: Sequence[str], *,
                                idempotency_key: str | None = None) -> JobAccepted:
        return cast(JobAccepted, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/bulk/delete", {"entityName": entity},
                 json={"recordIds": list(record_ids)}, headers={"Prefer": "respond-async"}, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def relate(self, entity: str, record_id: str, relationship: RelationshipInput, *,
                     idempotency_key: str | None = None) -> Relationship:
        """Link this record to another (`toEntityName`, `toRecordId`, `relationshipType`)."""
        return cast(Relationship, await self._client.request(
            Call("POST", "/api/v1/entities/{entityName}/records/{recordId}/relationships",
                 {"entityName": entity, "recordId": record_id}, json=relationship, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def relationships(self, entity: str, record_id: str, *, relationship_type: str | None = None,
                            target_entity: str | None = None,
                            direction: Literal["outgoing", "incoming", "both"] | None = None) -> list[Relationship]:
        answer = await self._client.request(Call(
            "GET", "/api/v1/entities/{entityName}/records/{recordId}/relationships",
            {"entityName": entity, "recordId": record_id},
            params={"relationshipType": relationship_type, "targetEntity": target_entity, "direction": direction}))
        return cast("list[Relationship]", answer["relationships"])

    async def unrelate(self, entity: str, record_id: str, relationship_id: str) -> Success:
        return cast(Success, await self._client.request(Call(
            "DELETE", "/api/v1/entities/{entityName}/records/{recordId}/relationships/{relationshipId}",
            {"entityName": entity, "recordId": record_id, "relationshipId": relationship_id})))


class AsyncEntities(AsyncResource):
    """The entity store: `definitions`, `views`, `records` (with query, iter, count, aggregate, bulk)."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client)
        self.definitions = AsyncDefinitions(client)
        self.views = AsyncViews(client)
        self.records = AsyncRecords(client)


class AsyncJobs(AsyncResource):
    """Background jobs of the entity store (bulk operations sent with `Prefer: respond-async`)."""

    async def get(self, job_id: str) -> JobStatus:
        return cast(JobStatus, await self._client.request(Call("GET", "/api/v1/jobs/{jobId}", {"jobId": job_id})))

    async def wait(self, job_id: str, *, timeout: float = 300.0, poll_interval: float = 0.2) -> JobStatus:
        """Poll until the job has succeeded (its status, `result` = BulkResult) or failed (JobFailedError
        with the status document); WaitTimeoutError after `timeout` seconds."""
        job = await self._client.wait_for(Call("GET", "/api/v1/jobs/{jobId}", {"jobId": job_id}),
                                          lambda doc: doc.get("status") in JOB_DONE, timeout=timeout,
                                          poll_interval=poll_interval)
        if job["status"] == "failed":
            raise errors.JobFailedError(f"job {job_id} failed: {job.get('error')}", job)
        return cast(JobStatus, job)


# -- analytics -------------------------------------------------------------------------------------------------

class AsyncAnalytics(AsyncResource):
    """Dashboards (`from_`/`to`: dates or ISO 8601 instants; default the last 30 days) and event ingest."""

    async def summary(self, *, from_: str | None = None, to: str | None = None) -> AnalyticsSummaryResponse:
        return cast(AnalyticsSummaryResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/summary", params={"from": from_, "to": to})))

    async def chats(self, *, from_: str | None = None, to: str | None = None, agent_id: str | None = None,
                    limit: int | None = None, offset: int | None = None) -> ChatAnalyticsListResponse:
        return cast(ChatAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/chats",
                 params={"from": from_, "to": to, "agent_id": agent_id, "limit": limit, "offset": offset})))

    async def iter_chats(self, *, from_: str | None = None, to: str | None = None, agent_id: str | None = None,
                         page_size: int = 500) -> AsyncIterator[ChatAnalytics]:
        offset = 0
        while True:
            page = await self.chats(from_=from_, to=to, agent_id=agent_id, limit=page_size, offset=offset)
            for item in page["data"]:
                yield item
            if not (page.get("metadata") or {}).get("hasMore"):
                return
            offset += len(page["data"])

    async def agents(self, *, from_: str | None = None, to: str | None = None) -> AgentAnalyticsListResponse:
        return cast(AgentAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/agents", params={"from": from_, "to": to})))

    async def usage(self, *, from_: str | None = None, to: str | None = None) -> UsageAnalyticsListResponse:
        return cast(UsageAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/usage", params={"from": from_, "to": to})))

    async def daily(self, *, from_: str | None = None, to: str | None = None) -> DailyAnalyticsListResponse:
        return cast(DailyAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/daily", params={"from": from_, "to": to})))

    async def series(self, *, from_: str | None = None, to: str | None = None, interval: Interval | None = None,
                     tz: str | None = None, agent_id: str | None = None, channel: str | None = None,
                     model: str | None = None) -> AnalyticsSeriesResponse:
        """Every metric per `interval` bucket (default `day`) in the IANA time zone `tz` (default UTC),
        with the window's totals; optionally of one agent, channel or model."""
        params = {"from": from_, "to": to, "interval": interval, "tz": tz, "agent_id": agent_id,
                  "channel": channel, "model": model}
        return cast(AnalyticsSeriesResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/series", params=params)))

    async def channels(self, *, from_: str | None = None, to: str | None = None) -> ChannelAnalyticsListResponse:
        return cast(ChannelAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/channels", params={"from": from_, "to": to})))

    async def events(self, *, from_: str | None = None, to: str | None = None, event_type: str | None = None,
                     event_category: str | None = None, user_id: str | None = None, session_id: str | None = None,
                     limit: int | None = None, offset: int | None = None) -> AnalyticsEventOutListResponse:
        params = {"from": from_, "to": to, "eventType": event_type, "eventCategory": event_category,
                  "userId": user_id, "sessionId": session_id, "limit": limit, "offset": offset}
        return cast(AnalyticsEventOutListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/events", params=params)))

    async def iter_events(self, *, from_: str | None = None, to: str | None = None, event_type: str | None = None,
                          event_category: str | None = None, user_id: str | None = None,
                          session_id: str | None = None, page_size: int = 500) -> AsyncIterator[AnalyticsEventOut]:
        offset = 0
        while True:
            page = await self.events(from_=from_, to=to, event_type=event_type, event_category=event_category,
                                     user_id=user_id, session_id=session_id, limit=page_size, offset=offset)
            for item in page["data"]:
                yield item
            if not (page.get("metadata") or {}).get("hasMore"):
                return
            offset += len(page["data"])

    async def record_event(self, event: AnalyticsEvent) -> str:
        """Record one event (stored in the background, idempotent by `eventId`); its eventId."""
        answer = await self._client.request(Call("POST", "/api/v1/analytics/events", json=event,
                                                 idempotent_post=True))
        return cast(str, answer["eventId"])

    async def record_events(self, events: Sequence[AnalyticsEvent]) -> BatchAccepted:
        """Record up to 500 events in one request."""
        return cast(BatchAccepted, await self._client.request(
            Call("POST", "/api/v1/analytics/events/batch", json={"events": list(events)}, idempotent_post=True)))

    async def track(self, event: AnalyticsEvent) -> bool:
        """Fire and forget: `record_event`, with any failure swallowed (False)."""
        try:
            await self.record_event(event)
        except errors.PlatformGatewayError:
            return False
        return True

    async def global_summary(self, *, from_: str | None = None,
                             to: str | None = None) -> GlobalAnalyticsSummaryResponse:
        """Platform-wide roll-up (role admin/super_admin)."""
        return cast(GlobalAnalyticsSummaryResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/global/summary", params={"from": from_, "to": to})))

    async def global_orgs(self, *, from_: str | None = None, to: str | None = None) -> OrgAnalyticsListResponse:
        return cast(OrgAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/global/orgs", params={"from": from_, "to": to})))

    async def global_series(self, *, from_: str | None = None, to: str | None = None,
                            interval: Interval | None = None, tz: str | None = None, org_id: str | None = None,
                            agent_id: str | None = None, channel: str | None = None,
                            model: str | None = None) -> AnalyticsSeriesResponse:
        """`series` over every organization of the product, or one `org_id` (role admin/super_admin)."""
        params = {"from": from_, "to": to, "interval": interval, "tz": tz, "org_id": org_id,
                  "agent_id": agent_id, "channel": channel, "model": model}
        return cast(AnalyticsSeriesResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/global/series", params=params)))

    async def global_channels(self, *, from_: str | None = None,
                              to: str | None = None) -> GlobalChannelSummaryListResponse:
        return cast(GlobalChannelSummaryListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/global/channels", params={"from": from_, "to": to})))

    async def channel_daily(self, channel: str, *, from_: str | None = None,
                            to: str | None = None) -> ChannelDailyListResponse:
        return cast(ChannelDailyListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/global/channels/{channel}/daily", {"channel": channel},
                 params={"from": from_, "to": to})))

    async def channel_orgs(self, channel: str, *, from_: str | None = None,
                           to: str | None = None) -> OrgChannelAnalyticsListResponse:
        return cast(OrgChannelAnalyticsListResponse, await self._client.request(
            Call("GET", "/api/v1/analytics/global/channels/{channel}/orgs", {"channel": channel},
                 params={"from": from_, "to": to})))


# -- email and newsletter --------------------------------------------------------------------------------------

class AsyncEmail(AsyncResource):
    async def send(self, *, to: Sequence[str], subject: str, body: str,
                   idempotency_key: str | None = None) -> SendEmailResponse:
        """Send one pre-rendered message (scope `write:notifications`). A delivery failure is an answer
        with `success: False` and the reason in `message`, not an exception."""
        return cast(SendEmailResponse, await self._client.request(
            Call("POST", "/api/v1/email/send", json={"to": list(to), "subject": subject, "body": body},
                 idempotent_post=True, idempotency_key=idempotency_key)))

    async def bulk_send(self, *, recipients: Sequence[str] | None = None, subject: str | None = None,
                        body: str | None = None, messages: Sequence[BulkMessage] | None = None,
                        idempotency_key: str | None = None) -> EmailJobAccepted:
        """Queue one message to many `recipients`, or many `messages` (each its own); `wait(jobId)`."""
        payload = _drop_none({"recipients": list(recipients) if recipients is not None else None,
                              "subject": subject, "body": body,
                              "messages": list(messages) if messages is not None else None})
        return cast(EmailJobAccepted, await self._client.request(
            Call("POST", "/api/v1/email/bulk-send", json=payload, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def job(self, job_id: str) -> EmailJob:
        answer = await self._client.request(Call("GET", "/api/v1/email/bulk-send/{jobId}", {"jobId": job_id}))
        return cast(EmailJob, answer["job"])

    async def wait(self, job_id: str, *, timeout: float = 600.0, poll_interval: float = 0.5) -> EmailJob:
        """Poll a bulk or newsletter job until it is done (its `counts` say what was sent and failed);
        JobFailedError when it was ended early (`error`), WaitTimeoutError after `timeout` seconds."""
        answer = await self._client.wait_for(Call("GET", "/api/v1/email/bulk-send/{jobId}", {"jobId": job_id}),
                                             lambda doc: doc["job"].get("status") in EMAIL_JOB_DONE,
                                             timeout=timeout, poll_interval=poll_interval)
        if answer["job"].get("error"):
            raise errors.JobFailedError(f"email job {job_id} ended early: {answer['job']['error']}", answer["job"])
        return cast(EmailJob, answer["job"])

    async def recipients(self, job_id: str, *, status: str | None = None, after: int | None = None,
                         limit: int | None = None) -> DeliveryList:
        return cast(DeliveryList, await self._client.request(
            Call("GET", "/api/v1/email/bulk-send/{jobId}/recipients", {"jobId": job_id},
                 params={"status": status, "after": after, "limit": limit})))

    async def iter_recipients(self, job_id: str, *, status: str | None = None,
                              page_size: int | None = None) -> AsyncIterator[Delivery]:
        pages = self._pages("GET", "/api/v1/email/bulk-send/{jobId}/recipients", "recipients",
                            {"status": status, "limit": page_size}, {"jobId": job_id}, "after")
        async for item in pages:
            yield item


class AsyncNewsletter(AsyncResource):
    async def subscribe(self, email: str, *, name: str | None = None, source: str | None = None) -> Subscriber:
        """Subscribe (or re-activate) an address; subscribing twice is harmless."""
        answer = await self._client.request(Call("POST", "/api/v1/newsletter/subscribers",
                                                 json=_drop_none({"email": email, "name": name, "source": source}),
                                                 idempotent_post=True))
        return cast(Subscriber, answer["subscriber"])

    async def subscribers(self, *, status: str | None = None, after: str | None = None,
                          limit: int | None = None) -> SubscriberList:
        return cast(SubscriberList, await self._client.request(
            Call("GET", "/api/v1/newsletter/subscribers", params={"status": status, "after": after, "limit": limit})))

    async def iter_subscribers(self, *, status: str | None = None,
                               page_size: int | None = None) -> AsyncIterator[Subscriber]:
        pages = self._pages("GET", "/api/v1/newsletter/subscribers", "subscribers",
                            {"status": status, "limit": page_size}, None, "after")
        async for item in pages:
            yield item

    async def unsubscribe(self, subscriber: str) -> Subscriber:
        """Unsubscribe by address or id."""
        answer = await self._client.request(Call("DELETE", "/api/v1/newsletter/subscribers/{subscriber}",
                                                 {"subscriber": subscriber}))
        return cast(Subscriber, answer["subscriber"])

    async def issues(self) -> list[EmailJob]:
        answer = cast(IssueList, await self._client.request(Call("GET", "/api/v1/newsletter/issues")))
        return answer["issues"]

    async def send_issue(self, *, subject: str, body: str, idempotency_key: str | None = None) -> EmailJobAccepted:
        """Send an issue to every active subscriber (a bulk job: `client.email.wait(jobId)`)."""
        return cast(EmailJobAccepted, await self._client.request(
            Call("POST", "/api/v1/newsletter/issues", json={"subject": subject, "body": body}, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def unsubscribe_page(self, token: str) -> str:
        """The HTML confirmation page of an unsubscribe link (no bearer token is sent)."""
        response = await self._client.send(Call("GET", "/api/v1/newsletter/unsubscribe", params={"token": token},
                                                auth=False))
        return response.text

    async def unsubscribe_by_token(self, token: str) -> Unsubscribed:
        """What the unsubscribe link's button does (no bearer token is sent)."""
        return cast(Unsubscribed, await self._client.request(
            Call("POST", "/api/v1/newsletter/unsubscribe", params={"token": token}, auth=False,
                 idempotent_post=True)))


# -- operations and administration ------------------------------------------------------------------------------

class AsyncAdmin(AsyncResource):
    """Seeding (internal token or admin role), platform artifacts and rollouts, definition upserts."""

    async def seed(self, org: SeedOrg, admin: SeedAdmin, *, idempotency_key: str | None = None) -> SeedReport:
        """Create an organization, its admin and the platform artifacts (again: nothing new, `created` False)."""
        return cast(SeedReport, await self._client.request(
            Call("POST", "/internal/seed", json={"org": org, "admin": admin}, idempotent_post=True,
                 idempotency_key=idempotency_key)))

    async def start_seed(self, org: SeedOrg, admin: SeedAdmin, *, idempotency_key: str | None = None) -> SeedQueued:
        """`seed` as a background task (`Prefer: respond-async`): `wait_seed(orgId, product)`."""
        return cast(SeedQueued, await self._client.request(
            Call("POST", "/internal/seed", json={"org": org, "admin": admin}, headers={"Prefer": "respond-async"},
                 idempotent_post=True, idempotency_key=idempotency_key)))

    async def seed_status(self, org_id: str, *, product: str | None = None) -> SeedStatus:
        return cast(SeedStatus, await self._client.request(Call("GET", "/internal/seed/{orgId}", {"orgId": org_id},
                                                                params={"product": product})))

    async def wait_seed(self, org_id: str, *, product: str | None = None, timeout: float = 300.0,
                        poll_interval: float = 0.5) -> SeedStatus:
        """Poll until the latest asynchronous seed of the org is done (JobFailedError if it failed). A
        deployment without a broker runs the seed inside the request and keeps no request to report
        (`lastRequest` null): there, done is every artifact present."""
        status = await self._client.wait_for(
            Call("GET", "/internal/seed/{orgId}", {"orgId": org_id}, params={"product": product}),
            _seed_finished, timeout=timeout, poll_interval=poll_interval)
        if (status.get("lastRequest") or {}).get("status") == "failed":
            raise errors.JobFailedError(f"seeding {org_id} failed: {status['lastRequest'].get('error')}", status)
        return cast(SeedStatus, status)

    async def artifacts(self) -> ArtifactList:
        return cast(ArtifactList, await self._client.request(Call("GET", "/api/v1/admin/artifacts")))

    async def publish(self, artifact: Publish, *, rollout: bool | None = None,
                      idempotency_key: str | None = None) -> Published:
        """Publish a new artifact version; unless `rollout=False` it is rolled out to every org
        (`wait_rollout(published["rollout"]["id"])`)."""
        return cast(Published, await self._client.request(
            Call("POST", "/api/v1/admin/artifacts", json=artifact, params={"rollout": rollout},
                 idempotent_post=True, idempotency_key=idempotency_key)))

    async def rollouts(self) -> RolloutList:
        return cast(RolloutList, await self._client.request(Call("GET", "/api/v1/admin/artifacts/rollouts")))

    async def rollout(self, rollout_id: str, *, outcome: str | None = None, after: str | None = None,
                      limit: int | None = None) -> RolloutDetail:
        return cast(RolloutDetail, await self._client.request(
            Call("GET", "/api/v1/admin/artifacts/rollouts/{rolloutId}", {"rolloutId": rollout_id},
                 params={"outcome": outcome, "after": after, "limit": limit})))

    async def iter_outcomes(self, rollout_id: str, *, outcome: str | None = None,
                            page_size: int | None = None) -> AsyncIterator[Outcome]:
        pages = self._pages("GET", "/api/v1/admin/artifacts/rollouts/{rolloutId}", "outcomes",
                            {"outcome": outcome, "limit": page_size}, {"rolloutId": rollout_id}, "after")
        async for item in pages:
            yield item

    async def resume_rollout(self, rollout_id: str) -> Rollout:
        return cast(Rollout, await self._client.request(
            Call("POST", "/api/v1/admin/artifacts/rollouts/{rolloutId}/resume", {"rolloutId": rollout_id},
                 idempotent_post=True)))

    async def wait_rollout(self, rollout_id: str, *, timeout: float = 600.0, poll_interval: float = 0.5) -> Rollout:
        """Poll until the rollout is done (JobFailedError when it failed; a superseded one is returned)."""
        detail = await self._client.wait_for(
            Call("GET", "/api/v1/admin/artifacts/rollouts/{rolloutId}", {"rolloutId": rollout_id},
                 params={"limit": 1}),
            lambda doc: doc["rollout"].get("status") in ROLLOUT_DONE, timeout=timeout, poll_interval=poll_interval)
        if detail["rollout"]["status"] == "failed":
            raise errors.JobFailedError(f"rollout {rollout_id} failed: {detail['rollout'].get('error')}",
                                        detail["rollout"])
        return cast(Rollout, detail["rollout"])

    async def upsert_definitions(self, definitions: Sequence[Mapping[str, Any]]) -> AdminUpsertResult:
        """Create or update entity definitions by name (role admin)."""
        return cast(AdminUpsertResult, await self._client.request(
            Call("POST", "/api/v1/admin/entities/update", json={"definitions": list(definitions)},
                 idempotent_post=True)))
