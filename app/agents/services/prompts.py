"""System prompts generated from an agent's goal.

A deterministic template (same agent fields → same prompt), so a generated prompt is
reproducible and reviewable; an LLM-backed generator can replace `generate_system_prompt` later.
The agent's `metadata.systemPromptGenerated` records that the prompt came from here.
"""

from __future__ import annotations

from typing import Any

TEMPLATE_VERSION = "goal-template-v1"
GENERATED_KEY = "systemPromptGenerated"


def generate_system_prompt(agent: dict[str, Any]) -> str:
    """A system prompt built from the agent's title, goal and style fields."""
    lines = [f"You are {agent['title']}."]
    if agent.get("description"):
        lines.append(agent["description"].strip())
    lines += ["", "Your goal:", agent["goal"].strip()]
    if agent.get("capabilities"):
        lines += ["", "You can help with:"] + [f"- {c}" for c in agent["capabilities"]]
    style = []
    if agent.get("responseStyle"):
        style.append(f"Respond in a {agent['responseStyle']} style.")
    if agent.get("personalityTraits"):
        style.append(f"Be {', '.join(agent['personalityTraits'])}.")
    if style:
        lines += ["", " ".join(style)]
    lines += ["", "Guidelines:",
              "- Stay focused on the goal above and on the user's request.",
              "- Ask a short clarifying question when the request is ambiguous.",
              "- Say so plainly when you do not know something; never invent facts."]
    if agent.get("fallbackMessage"):
        lines.append(f'- When you cannot help, answer: "{agent["fallbackMessage"]}"')
    return "\n".join(lines)


def was_generated(agent: dict[str, Any]) -> bool:
    return bool((agent.get("metadata") or {}).get(GENERATED_KEY))


def apply_system_prompt(doc: dict[str, Any], *, previous: dict[str, Any] | None, prompt_sent: bool,
                        moment_iso: str) -> None:
    """Generate the prompt when it is empty and a goal is given, or keep a generated prompt in
    step with the goal while the caller has not written one; record it in `metadata`."""
    metadata = dict(doc.get("metadata") or {})
    metadata.pop(GENERATED_KEY, None)
    still_generated = previous is not None and was_generated(previous) and not prompt_sent
    if doc.get("goal") and (not doc.get("systemPrompt") or still_generated):
        prompt = generate_system_prompt(doc)
        same = previous is not None and was_generated(previous) and previous.get("systemPrompt") == prompt
        doc["systemPrompt"] = prompt
        metadata[GENERATED_KEY] = (previous["metadata"][GENERATED_KEY] if same else
                                   {"source": "goal", "template": TEMPLATE_VERSION, "generatedAt": moment_iso})
    if metadata or doc.get("metadata") == {}:  # an empty object the caller sent is echoed as sent
        doc["metadata"] = metadata
    else:
        doc.pop("metadata", None)
