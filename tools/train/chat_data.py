"""Simple question/answer turns for the chat fine-tune, made from the training corpus and a few templates.

The answers are sentences of the corpus (or short fixed replies), so the fine-tune teaches the turn format and
an answering register, not new facts.
"""
import random
import re

GREETINGS = [
    ("Hello", "Hello! I am a small language model trained on Debian, Python and Linux documentation. "
              "Ask me about packages, the shell or Python."),
    ("Hi", "Hi! How can I help you today?"),
    ("Hello, who are you?", "I am a small language model trained on free software documentation. "
                            "I can talk about Debian, Linux and Python."),
    ("Good morning", "Good morning! What would you like to know?"),
    ("What can you do?", "I can answer simple questions about Debian packages, the Linux kernel and the "
                         "Python language, and write short explanations in English."),
    ("Thank you", "You are welcome. Is there anything else you would like to know?"),
    ("Thanks!", "You are welcome!"),
    ("How are you?", "I am fine, thank you. What would you like to talk about?"),
    ("Who made you?", "I was trained from scratch on free documentation: the Debian Administrator's Handbook, "
                      "the Debian Reference, the Python documentation and the Linux kernel documentation."),
    ("Say something in English.", "This is a sentence in English, written by a very small model."),
]

SYSTEMS = ["", "", "", "You are a helpful assistant.", "You are a helpful assistant. Answer briefly."]

DEFN = re.compile(r"^(?:The |A |An )?([A-Za-z][\w\-\./+ ]{1,40}?) (is|are) (a|an|the|used|one|responsible) ")
SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def sentences(par):
    return [s.strip() for s in SENT.split(par) if s.strip()]


def examples(paragraphs, n, seed=0):
    """n conversations: lists of {"role", "content"}; the last message is the assistant's answer."""
    rng = random.Random(seed)
    defs, prose = [], []
    for p in paragraphs:
        ss = sentences(p)
        if len(ss) < 2 or len(p) > 1200:
            continue
        prose.append(ss)
        m = DEFN.match(p)
        if m and len(m.group(1).split()) <= 5:
            defs.append((m.group(1).strip(), m.group(2), ss))
    if not prose:
        raise ValueError("no usable paragraphs for chat examples")
    out = []
    for i in range(n):
        kind = rng.random()
        sysmsg = rng.choice(SYSTEMS)
        msgs = [{"role": "system", "content": sysmsg}] if sysmsg else []
        if kind < 0.08:
            q, a = rng.choice(GREETINGS)
        elif kind < 0.55 and defs:
            term, verb, ss = rng.choice(defs)
            q = rng.choice([f"What {verb} {term}?", f"Tell me about {term}.", f"Explain {term}.",
                            f"Can you explain what {term} {verb}?", f"What do you know about {term}?"])
            a = " ".join(ss[:rng.choice([1, 2, 2, 3])])
        elif kind < 0.75:
            ss = rng.choice(prose)
            q = rng.choice(["Summarize this text in one sentence:\n\n", "What is the main point of this?\n\n",
                            "Give me a short summary:\n\n"]) + " ".join(ss)
            a = ss[0]
        else:
            ss = rng.choice(prose)
            q = rng.choice(["Continue this text: ", "How does this continue? ", "Complete: "]) + ss[0]
            a = " ".join(ss[1:3])
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        out.append(msgs)
    return out
