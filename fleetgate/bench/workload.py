"""The cost benchmark's workload: seeded, multi-tenant, production-shaped, with ground truth.

What it generates (all from `seed`, so anyone can rerun it):

- Tenants, each with its own long system prompt (a support assistant's policy text, ~1.5k tokens):
  every request of a tenant shares that prefix, which is what prefix-affinity routing exploits.
- Support questions (easy: the small tier answers them well). Each *intent* has several phrasings;
  intents are drawn with Zipf popularity, so popular questions come back in paraphrase, which is
  what a semantic cache exploits. Each intent has a *near-miss twin* (enable vs disable, 30 vs 60
  days, iOS vs Android) asked too: a cache that serves one for the other is wrong.
- Hard prompts (the large tier is needed): code generation, debugging, multi-step word problems,
  proofs, system design; unique parameters, so they never repeat.
- Multi-turn chats: a support conversation whose history grows, then a follow-up question.
- Poisson arrivals at `rate_rps`.

`generate_lora` is the workload of the LoRA comparison (`fleetgate bench cost --lora`): N fine-tunes of one
base model (`ft-0` .. `ft-{N-1}`, each owned by its own tenant `t-k` with its own system prompt), chosen
per request with Zipf popularity (exponent `zipf_s`, ft-0 hottest); support questions made unique by a
ticket number (no answer repeats, so no response cache is involved), Poisson arrivals. Each item names
its fine-tune in `adapter`: it is the model the client asks for.

Ground truth per request: `answer_key` (two requests whose answer keys are equal may share one
answer; anything else is a wrong hit), `needs_tier` ("small" or "large") and `kind`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

TENANTS = ("acme", "globex", "initech", "umbrella")

# intent -> (phrasings, near-miss twin intent). Twins differ in one slot that changes the answer.
INTENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "enable-2fa": (
        ("How do I enable two-factor authentication?", "How can I turn on two-factor authentication?",
         "What are the steps to enable 2FA on my account?", "how do i enable two factor authentication"),
        "disable-2fa",
    ),
    "disable-2fa": (
        ("How do I disable two-factor authentication?", "How can I turn off two-factor authentication?",
         "What are the steps to disable 2FA on my account?"),
        "enable-2fa",
    ),
    "reset-password": (
        ("How do I reset my password?", "How can I reset my password?", "I forgot my password, how do I reset it?",
         "What is the way to reset my password?"),
        "change-email",
    ),
    "change-email": (
        ("How do I change the email address on my account?", "How can I update my account email address?"),
        "reset-password",
    ),
    "refund-30": (
        ("Can I get a refund within 30 days of purchase?", "Is a refund possible within 30 days of buying?",
         "Am I eligible for a refund within 30 days of purchase?"),
        "refund-90",
    ),
    "refund-90": (
        ("Can I get a refund within 90 days of purchase?", "Is a refund possible within 90 days of buying?"),
        "refund-30",
    ),
    "cancel-subscription": (
        ("How do I cancel my subscription?", "How can I cancel my subscription?",
         "What are the steps to cancel my subscription?", "Please tell me how to cancel my subscription."),
        "pause-subscription",
    ),
    "pause-subscription": (
        ("How do I pause my subscription?", "How can I pause my subscription for a month?"),
        "cancel-subscription",
    ),
    "app-ios": (
        ("How do I install the mobile app on iOS?", "How can I install your app on my iPhone running iOS?"),
        "app-android",
    ),
    "app-android": (
        ("How do I install the mobile app on Android?", "How can I install your app on my Android phone?"),
        "app-ios",
    ),
    "export-csv": (
        ("How do I export my invoices as CSV?", "How can I download my invoices in CSV format?"),
        "export-pdf",
    ),
    "export-pdf": (
        ("How do I export my invoices as PDF?", "How can I download my invoices in PDF format?"),
        "export-csv",
    ),
    "shipping-time": (
        ("How long does standard shipping take?", "What is the delivery time for standard shipping?",
         "How many days does standard shipping usually take?"),
        "shipping-express",
    ),
    "shipping-express": (
        ("How long does express shipping take?", "What is the delivery time for express shipping?"),
        "shipping-time",
    ),
    "add-user": (
        ("How do I add a new user to my team?", "How can I invite a new team member?",
         "What are the steps to add a user to my team?"),
        "remove-user",
    ),
    "remove-user": (
        ("How do I remove a user from my team?", "How can I remove a team member?"),
        "add-user",
    ),
}

HARD_TEMPLATES: tuple[str, ...] = (
    "Write a Python function that merges {n} sorted linked lists in O(N log k) time, explain its complexity, "
    "and include unit tests for empty lists and duplicate values.",
    "A train leaves city A at {h}:00 travelling at {v} km/h; a second train leaves city B, {d} km away, one hour "
    "later at {w} km/h towards A. At what time and where do they meet? Show every step.",
    "Prove that the sum of the first {n} odd numbers is a perfect square, then generalise the argument to "
    "arithmetic progressions with common difference {k}.",
    "Design a rate limiter service for {n} million users with per-user and global quotas, multi-region "
    "replication and a p99 under {k} ms. Discuss data structures, consistency and failure modes.",
    "This Go function deadlocks when called with {n} workers. Find every bug and explain the fix:\n"
    "func run(jobs []int) {{ var wg sync.WaitGroup; ch := make(chan int); for _, j := range jobs {{ "
    "wg.Add(1); go func() {{ ch <- j * {k}; wg.Done() }}() }}; wg.Wait(); close(ch) }}",
    "Plan a {n}-day conference for {k} attendees with three parallel tracks, a fixed budget, accessibility "
    "constraints and speaker travel; give the schedule, the budget split and the risks.",
)

EASY_EXTRA: tuple[str, ...] = (
    "Translate 'thank you for your order' into {lang}.",
    "Classify this ticket as billing, technical or shipping: 'order {n} has not arrived yet'.",
    "What is {a} plus {b}?",
)
LANGS = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch")


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request of the workload and its ground truth."""

    at_s: float  # arrival time from the start
    tenant: str
    messages: tuple[dict[str, str], ...]
    answer_key: str  # requests with equal keys may share one answer
    needs_tier: str  # "small" | "large"
    kind: str  # support | near-miss | hard | easy-misc | chat-followup
    max_tokens: int = 256
    adapter: str | None = None  # the LoRA workload's fine-tune: the model this request asks for

    def body(self, *, model: str) -> dict[str, Any]:
        return {"model": model, "messages": list(self.messages), "max_tokens": self.max_tokens, "temperature": 0}


@dataclass(slots=True)
class Workload:
    seed: int
    items: list[WorkItem] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in self.items:
            out[item.kind] = out.get(item.kind, 0) + 1
        return out


def system_prompt(tenant: str, *, words: int = 1100) -> str:
    """A long, tenant-specific policy text (~1.4 tokens per word: ~1.5k tokens for 1,100 words)."""
    rng = random.Random(f"system:{tenant}")
    vocab = ("orders", "refunds", "accounts", "security", "shipping", "invoices", "teams", "devices",
             "support", "policy", "customers", "subscriptions", "payments", "privacy", "returns", "warranty")
    sentences = [f"You are the support assistant of {tenant.title()} Inc. Answer briefly and follow this policy."]
    while sum(len(s.split()) for s in sentences) < words:
        a, b, c = rng.sample(vocab, 3)
        sentences.append(f"Section {len(sentences)}: questions about {a} and {b} are answered using the {c} "
                         f"handbook, revision {rng.randint(1, 40)}, without promising exceptions.")
    return " ".join(sentences)


def _zipf_weights(n: int, s: float = 1.1) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def generate(
    *,
    seed: int = 7,
    requests: int = 600,
    rate_rps: float = 20.0,
    tenants: tuple[str, ...] = TENANTS,
    share_support: float = 0.55,
    share_near_miss: float = 0.10,
    share_hard: float = 0.20,
    share_chat: float = 0.05,
) -> Workload:
    """Generate the workload. The remaining share after the named ones is miscellaneous easy prompts."""
    rng = random.Random(seed)
    systems = {t: system_prompt(t) for t in tenants}
    intents = sorted(INTENTS)
    weights = _zipf_weights(len(intents))
    rng.shuffle(intents)
    workload = Workload(seed=seed)
    t = 0.0
    kinds = ("support", "near-miss", "hard", "chat-followup", "easy-misc")
    rest = max(0.0, 1.0 - share_support - share_near_miss - share_hard - share_chat)
    shares = (share_support, share_near_miss, share_hard, share_chat, rest)
    for i in range(requests):
        t += rng.expovariate(rate_rps)
        tenant = rng.choice(tenants)
        system = {"role": "system", "content": systems[tenant]}
        kind = rng.choices(kinds, weights=shares)[0]
        if kind in ("support", "near-miss"):
            intent = rng.choices(intents, weights=weights)[0]
            if kind == "near-miss":
                intent = INTENTS[intent][1]
            phrasing = rng.choice(INTENTS[intent][0])
            item = WorkItem(at_s=t, tenant=tenant, messages=(system, {"role": "user", "content": phrasing}),
                            answer_key=f"{tenant}:{intent}", needs_tier="small", kind=kind)
        elif kind == "hard":
            template = rng.choice(HARD_TEMPLATES)
            prompt = template.format(n=rng.randint(3, 99), h=rng.randint(5, 11), v=rng.randint(60, 140),
                                     d=rng.randint(200, 900), w=rng.randint(60, 140), k=rng.randint(2, 50))
            item = WorkItem(at_s=t, tenant=tenant, messages=(system, {"role": "user", "content": prompt}),
                            answer_key=f"hard:{i}", needs_tier="large", kind=kind, max_tokens=512)
        elif kind == "chat-followup":
            intent = rng.choices(intents, weights=weights)[0]
            first = rng.choice(INTENTS[intent][0])
            order = rng.randint(10000, 99999)
            messages = (
                system,
                {"role": "user", "content": first},
                {"role": "assistant", "content": f"Sure. Which order or account is this about? (ref {intent})"},
                {"role": "user", "content": f"It is about order {order}. Does that change anything?"},
            )
            item = WorkItem(at_s=t, tenant=tenant, messages=messages, answer_key=f"chat:{i}",
                            needs_tier="small", kind=kind)
        else:
            template = rng.choice(EASY_EXTRA)
            prompt = template.format(lang=rng.choice(LANGS), n=rng.randint(1000, 9999), a=rng.randint(2, 99),
                                     b=rng.randint(2, 99))
            item = WorkItem(at_s=t, tenant=tenant, messages=(system, {"role": "user", "content": prompt}),
                            answer_key=f"{tenant}:misc:{prompt}", needs_tier="small", kind=kind)
        workload.items.append(item)
    return workload


def generate_lora(
    *, seed: int = 7, requests: int = 600, rate_rps: float = 12.0, fine_tunes: int = 8, zipf_s: float = 1.1,
    system_words: int = 300,
) -> Workload:
    """The LoRA comparison's workload (see the module docstring)."""
    rng = random.Random(seed)
    names = [f"ft-{k}" for k in range(fine_tunes)]
    systems = {name: system_prompt(name, words=system_words) for name in names}
    weights = _zipf_weights(fine_tunes, zipf_s)
    intents = sorted(INTENTS)
    workload = Workload(seed=seed)
    t = 0.0
    for i in range(requests):
        t += rng.expovariate(rate_rps)
        k = rng.choices(range(fine_tunes), weights=weights)[0]
        question = f"{rng.choice(INTENTS[rng.choice(intents)][0])} (ticket {i}-{rng.randint(1000, 9999)})"
        messages = ({"role": "system", "content": systems[names[k]]}, {"role": "user", "content": question})
        workload.items.append(WorkItem(at_s=t, tenant=f"t-{k}", messages=messages, answer_key=f"lora:{i}",
                                       needs_tier="small", kind=names[k], adapter=names[k]))
    return workload
