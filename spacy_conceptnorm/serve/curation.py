"""A curation session: the mentions of an `annotate` output, the reviewer's decisions on them, and the synonyms
added to the pipeline's linker, all rebuilt from the reviews log when the server starts.

Decisions form one undo stack: `undo` reverts the latest decision still in force, whatever its mention. A synonym
is added with `add_synonyms` (searched at once, no retraining); every loaded mention with the same normalized text
is then re-linked by the pipeline's linker (on its text alone: long forms, composite splitting and document
consistency are not redone), and undoing it removes the synonym again (only if it was new) and re-links them back.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from spacy.language import Language

from ..errors import Warnings
from ..evaluation.gold import get_normalizer
from ..io.pipelines import save
from ..kb.knowledge_base import DOMAIN, SOURCE_BITS
from ..linking.scoring import NIL
from ..pipeline.concept_normalizer import mention_context
from ..search.sieve import Match
from .nil_groups import CachedEncoder, group_nil
from .store import Annotations, Mention, ReviewLog, write_synonyms

DECISIONS = ("accept", "choose", "nil")
STATUSES = ("all", "unreviewed", "reviewed", "accepted", "changed", "nil", "synonym")
CONTEXT_CHARS = 240  # at most this many characters each side of a mention, cut at its sentence's ends
SENTENCE_ENDS = (". ", "! ", "? ", "\n")
SEARCH_STRATEGY = "OD-T"  # KB search: every name, ontology and domain alike, one ranked list


class CurationError(Exception):
    """A request that cannot be carried out; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Filters:
    """Which mentions a list shows: exact concept id (any part of a composite), label and document id, review
    status (one of STATUSES) and a substring of the mention text (case-insensitive); empty means any."""

    concept: str = ""
    label: str = ""
    document: str = ""
    status: str = "all"
    q: str = ""


@dataclass
class Link:
    """A link of a mention: the annotate output's, or the linker's answer after a synonym changed it."""

    concept_id: str
    matched: str | None  # the name that matched
    score: float | None
    confidence: float | None
    stage: str | None


def _is_nil(concept_id: str) -> bool:
    return not concept_id or any(part == NIL for part in concept_id.split("|"))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Curation:
    """The session's state; every method is safe to call from several threads (one lock).

    nlp (Language): The pipeline, with a concept_normalizer.
    annotations (Annotations): The mentions under review.
    log (ReviewLog): The reviews log; its decisions are replayed here first.
    synonyms_path (Optional[Path]): Rewritten atomically with the synonyms in force after each change.
    save_dir (Optional[Path]): Where `save_pipeline` writes the pipeline (with its synonyms); None: no saving.
    nil_method (str): "coder" (CODER++ term clustering, `spacy_conceptnorm.clustering`) or "text" (one group per
        normalized mention text).
    """

    def __init__(
        self,
        nlp: Language,
        annotations: Annotations,
        log: ReviewLog,
        synonyms_path: Path | None = None,
        save_dir: Path | None = None,
        nil_method: str = "coder",
    ) -> None:
        self.nlp = nlp
        _, self.normalizer = get_normalizer(nlp)
        self.kb = self.normalizer.kb
        self.annotations = annotations
        self.mentions = annotations.mentions
        self.log = log
        self.synonyms_path = synonyms_path
        self.save_dir = save_dir
        self.nil_method = nil_method
        self._nil_encoder = CachedEncoder(self.normalizer.encoder)
        self.lock = threading.RLock()
        self.version = 0  # bumped by every change: cached filtered lists are keyed on it
        self.link_version = 0  # bumped when a synonym re-links mentions: the worst-first order depends on it alone
        self.keys = [self.kb.normalizer(m.text) for m in self.mentions]
        self.by_key: dict[str, list[int]] = {}
        for i, key in enumerate(self.keys):
            self.by_key.setdefault(key, []).append(i)
        doc_ids = annotations.doc_ids
        self.by_position = {(doc_ids[m.doc], m.start, m.end): i for i, m in enumerate(self.mentions)}
        self.labels = sorted({m.label for m in self.mentions})
        self.relinked: dict[str, Link] = {}
        self.decisions: dict[int, list[dict]] = {}
        self.active: list[dict] = []  # decisions in force, oldest first: the undo stack
        self._matches: dict[str, Match] = {}
        # the rows' candidate lists per text, built from `_matches` (and emptied with it), and concept names
        # (canonical names do not change here): 70% of a 50-row page's time on a 10,000-document output
        self._candidate_rows: dict[str, list[dict]] = {}
        self._concept_names: dict[str, str | None] = {}
        self._lists: OrderedDict[tuple, list[int]] = OrderedDict()
        self._order: tuple[int, list[int]] | None = None
        self._nil: tuple[tuple, list[dict]] | None = None
        self._replay()

    # --- the log ------------------------------------------------------------------------------------------------
    def _replay(self) -> None:
        """Rebuild the decisions and synonyms of earlier sessions from the log."""
        by_seq: dict[int, dict] = {}
        for event in self.log.events:
            if event.get("action") == "undo":
                target = by_seq.get(event.get("undoes"))
                if target is not None and self.active and self.active[-1] is target:
                    self._revert(target)
                continue
            if event.get("action") == "synonym" and self.kb.resolve(str(event.get("concept_id"))) is None:
                what = f"concept {event.get('concept_id')!r} (not in the knowledge base)"
                warnings.warn(Warnings.W972.format(seq=event["seq"], what=what), stacklevel=2)
                continue
            if event.get("action") in DECISIONS and self._index(event) is None:
                what = f"the mention {event.get('text')!r} of document {event.get('doc_id')!r} at {event.get('start')}"
                warnings.warn(Warnings.W972.format(seq=event["seq"], what=what), stacklevel=2)
            by_seq[event["seq"]] = event
            self._apply(event)
        if self.log.events:
            self._write_synonyms()

    def _index(self, event: dict) -> int | None:
        return self.by_position.get((str(event.get("doc_id")), event.get("start"), event.get("end")))

    def _apply(self, event: dict) -> list[int]:
        """Put a decision in force; returns the mentions whose rows changed."""
        i = self._index(event)
        changed = [] if i is None else [i]
        if i is not None:
            self.decisions.setdefault(i, []).append(event)
        self.active.append(event)
        if event["action"] == "synonym":
            self.normalizer.add_synonyms([(event["text"], event["concept_id"])])
            changed = sorted(set(changed) | set(self._relink(self.kb.normalizer(event["text"]))))
        self.version += 1
        return changed

    def _revert(self, event: dict) -> list[int]:
        """Take the latest decision in force back; returns the mentions whose rows changed."""
        self.active.pop()
        i = self._index(event)
        changed = [] if i is None else [i]
        if i is not None:
            self.decisions[i].remove(event)
        if event["action"] == "synonym":
            # add_synonyms counts a pair added again, so this removal leaves a pair that was there before
            self.normalizer.remove_synonyms([(event["text"], event["concept_id"])])
            changed = sorted(set(changed) | set(self._relink(self.kb.normalizer(event["text"]))))
        self.version += 1
        return changed

    def _write_synonyms(self) -> None:
        if self.synonyms_path is not None:
            pairs = dict.fromkeys((e["text"], e["concept_id"]) for e in self.active if e["action"] == "synonym")
            write_synonyms(self.synonyms_path, pairs)

    # --- linking ------------------------------------------------------------------------------------------------
    def _link_texts(self, indices: list[int]) -> None:
        """Link the mention texts not linked yet (one batch), for their candidates."""
        todo = {self.keys[i]: i for i in indices if self.keys[i] not in self._matches}
        if not todo:
            return
        texts = [self.mentions[i].text for i in todo.values()]
        contexts = [self._bracketed(i) for i in todo.values()]
        for key, match in zip(todo, self.normalizer.linker.link(texts, contexts)):
            self._matches[key] = match

    def _bracketed(self, i: int) -> str:
        """The mention in its context as the linker's pair scorers read it: "left [mention] right"."""
        m = self.mentions[i]
        return mention_context(m.text, self.annotations.texts[m.doc], m.start, m.end)

    def _relink(self, key: str) -> list[int]:
        """Re-link the mentions of one normalized text after its synonyms changed (back to the annotate output's
        links when no synonym of this session is left for it); returns their indices."""
        self._matches.clear()  # a synonym may change other texts' candidates too
        self._candidate_rows.clear()
        self.link_version += 1
        if not any(self.kb.normalizer(e["text"]) == key for e in self.active if e["action"] == "synonym"):
            self.relinked.pop(key, None)
            return list(self.by_key.get(key, ()))
        indices = self.by_key.get(key, [])
        if indices:
            self._link_texts(indices[:1])
            match = self._matches[key]
            nil = self.normalizer.cfg["nil_threshold"]
            top = match.candidates[0][0] if match.candidates and (match.confidence or 0.0) >= nil else NIL
            name = match.names[0] if match.names else None
            score = match.score if match.candidates else None
            self.relinked[key] = Link(top, name, score, match.confidence, match.stage)
        return list(indices)

    def auto_link(self, i: int) -> Link:
        """The linker's link of mention i: the annotate output's, unless a synonym re-linked its text."""
        found = self.relinked.get(self.keys[i])
        if found is not None:
            return found
        m = self.mentions[i]
        return Link(m.concept_id, m.name, m.score, m.confidence, m.stage)

    # --- rows ---------------------------------------------------------------------------------------------------
    def concept_name(self, concept_id: str) -> str | None:
        if concept_id not in self._concept_names:
            self._concept_names[concept_id] = self._concept_name(concept_id)
        return self._concept_names[concept_id]

    def _concept_name(self, concept_id: str) -> str | None:
        names = []
        for part in concept_id.split("|"):
            cid = self.kb.resolve(part) if part and part != NIL else None
            names.append(self.kb.concepts[cid].canonical_name if cid else None)
        return " | ".join(n or "?" for n in names) if any(names) else None

    def status(self, i: int) -> str:
        decisions = self.decisions.get(i)
        if not decisions:
            return "unreviewed"
        last = decisions[-1]
        if last["action"] in ("synonym", "nil"):
            return last["action"]
        return "accepted" if last["concept_id"] == last.get("linked") else "changed"

    def final_concept(self, i: int) -> str:
        decisions = self.decisions.get(i)
        return decisions[-1]["concept_id"] if decisions else self.auto_link(i).concept_id

    def _context(self, i: int) -> dict | None:
        """The mention in its sentence (at most CONTEXT_CHARS each side), or None without the document text."""
        m = self.mentions[i]
        text = self.annotations.texts[m.doc]
        if not text or text[m.start : m.end] != m.text:
            return None
        lo, hi = max(0, m.start - CONTEXT_CHARS), min(len(text), m.end + CONTEXT_CHARS)
        starts = [text.rfind(end, lo, m.start) + len(end) for end in SENTENCE_ENDS if text.rfind(end, lo, m.start) >= 0]
        left = max(starts, default=lo)
        right = min((e + 1 for e in (text.find(end, m.end, hi) for end in SENTENCE_ENDS) if e >= 0), default=hi)
        return {
            "left": text[left : m.start], "mention": m.text, "right": text[m.end : right],
            "cut_left": left > 0 and left == lo, "cut_right": right < len(text) and right == hi,
        }  # fmt: skip

    def _candidates(self, i: int) -> list[dict]:
        key = self.keys[i]
        if key not in self._candidate_rows and key in self._matches:
            self._candidate_rows[key] = self._candidate_list(self._matches[key])
        return self._candidate_rows.get(key, [])

    def _candidate_list(self, match: Match) -> list[dict]:
        names = match.names + [None] * (len(match.candidates) - len(match.names))
        return [
            {"concept_id": cid, "name": self.concept_name(cid), "matched": self.kb.surface(n) if n else None,
             "score": round(float(score), 4)}
            for (cid, score), n in zip(match.candidates, names)
        ]  # fmt: skip

    def _decision(self, i: int) -> dict | None:
        decisions = self.decisions.get(i)
        if not decisions:
            return None
        d = decisions[-1]
        keys = ("seq", "action", "concept_id", "time")
        return {**{k: d.get(k) for k in keys}, "concept_name": self.concept_name(d["concept_id"])}

    def _row(self, i: int) -> dict:
        m = self.mentions[i]
        link = self.auto_link(i)
        return {
            "id": i,
            "doc_id": self.annotations.doc_ids[m.doc],
            "start": m.start,
            "end": m.end,
            "text": m.text,
            "label": m.label,
            "assertion": m.assertion,
            "context": self._context(i),
            "link": {**vars(link), "concept_name": self.concept_name(link.concept_id), "nil": _is_nil(link.concept_id)},
            "relinked": self.keys[i] in self.relinked,
            "original_concept_id": m.concept_id,
            "parts": m.parts,
            "candidates": self._candidates(i),
            "status": self.status(i),
            "decision": self._decision(i),
            "concept_id": self.final_concept(i),
        }

    def rows(self, indices: list[int]) -> list[dict]:
        """The rows of some mentions, with their candidates (linked in one batch)."""
        with self.lock:
            self._link_texts(indices)
            return [self._row(i) for i in indices]

    def row(self, i: int) -> dict:
        self._check_mention(i)
        return self.rows([i])[0]

    # --- lists --------------------------------------------------------------------------------------------------
    def _sort_key(self, i: int) -> tuple:
        """Worst first: NIL, then the lowest confidence (the score where the output has none), then file order."""
        link = self.auto_link(i)
        value = link.confidence if link.confidence is not None else link.score
        return (not _is_nil(link.concept_id), value if value is not None else 0.0, i)

    def _matches_filters(self, i: int, f: Filters) -> bool:
        m = self.mentions[i]
        if f.label and m.label != f.label:
            return False
        if f.document and self.annotations.doc_ids[m.doc] != f.document:
            return False
        if f.concept and f.concept not in self.final_concept(i).split("|"):
            return False
        if f.q and f.q.lower() not in m.text.lower():
            return False
        if f.status == "all":
            return True
        status = self.status(i)
        return status != "unreviewed" if f.status == "reviewed" else status == f.status

    def order(self) -> list[int]:
        """Every mention, worst first (sorted again only after a synonym re-linked some)."""
        with self.lock:
            if self._order is None or self._order[0] != self.link_version:
                self._order = (self.link_version, sorted(range(len(self.mentions)), key=self._sort_key))
            return self._order[1]

    def select(self, filters: Filters) -> list[int]:
        """The mentions that pass the filters, worst first (cached until the next change)."""
        with self.lock:
            if filters == Filters():
                return self.order()
            key = (self.version, filters)
            if key not in self._lists:
                self._lists[key] = [i for i in self.order() if self._matches_filters(i, filters)]
                while len(self._lists) > 32:
                    self._lists.popitem(last=False)
            self._lists.move_to_end(key)
            return self._lists[key]

    def page(self, filters: Filters, offset: int, limit: int) -> dict:
        """One page of the list: {"total", "offset", "limit", "rows"}."""
        with self.lock:
            if filters.concept and filters.concept != NIL:  # any id of the concept
                filters = replace(filters, concept=self.kb.resolve(filters.concept) or filters.concept)
            found = self.select(filters)
            return {"total": len(found), "offset": offset, "limit": limit,
                    "rows": self.rows(found[offset : offset + limit])}  # fmt: skip

    # --- decisions ----------------------------------------------------------------------------------------------
    def _check_mention(self, i: int) -> Mention:
        if not 0 <= i < len(self.mentions):
            raise CurationError(404, f"No mention {i} (there are {len(self.mentions)}).")
        return self.mentions[i]

    def _resolve(self, concept_id: str) -> str:
        found = self.kb.resolve(concept_id)
        if found is None:
            raise CurationError(400, f"Unknown concept id {concept_id!r}: not in the pipeline's knowledge base.")
        return found

    def _event(self, i: int, action: str, concept_id: str, **more: object) -> dict:
        m = self.mentions[i]
        return {
            "time": _now(), "action": action, "doc_id": self.annotations.doc_ids[m.doc], "start": m.start,
            "end": m.end, "text": m.text, "concept_id": concept_id, "linked": self.auto_link(i).concept_id, **more,
        }  # fmt: skip

    def decide(self, i: int, action: str, concept_id: str | None = None) -> dict:
        """Accept the link of mention i, choose another concept for it, or mark it NIL; logged first.

        i (int): The mention.
        action (str): "accept", "choose" (with `concept_id`) or "nil".
        concept_id (Optional[str]): The concept chosen (any of its ids).
        RETURNS (dict): {"event", "rows": [the changed row]}.
        """
        with self.lock:
            self._check_mention(i)
            if action not in DECISIONS:
                raise CurationError(400, f"Unknown action {action!r}; choose one of {DECISIONS}.")
            if action == "choose":
                if not concept_id:
                    raise CurationError(400, "Choosing a concept needs a concept_id.")
                chosen = self._resolve(concept_id)
            else:
                chosen = self.auto_link(i).concept_id if action == "accept" else NIL
            event = self.log.append(self._event(i, action, chosen))
            return {"event": event, "rows": self.rows(self._apply(event))}

    def add_synonym(self, i: int, concept_id: str) -> dict:
        """Add the text of mention i as a domain synonym of a concept (searched at once) and re-link every loaded
        mention with the same normalized text.

        RETURNS (dict): {"event", "rows": the changed rows, the mention's first}.
        """
        with self.lock:
            m = self._check_mention(i)
            cid = self._resolve(concept_id)
            if not self.keys[i]:
                raise CurationError(400, f"The mention {m.text!r} normalizes to nothing: it cannot be a synonym.")
            new = cid not in self.kb.concepts_for(self.keys[i], SOURCE_BITS[DOMAIN])
            event = self.log.append(self._event(i, "synonym", cid, new=new))
            changed = self._apply(event)
            self._write_synonyms()
            return {"event": event, "rows": self.rows([i] + [j for j in changed if j != i])}

    def undo(self) -> dict:
        """Take back the latest decision in force (a synonym is removed again); logged first.

        RETURNS (dict): {"event": the undo, "undone": the decision, "rows": the changed rows}.
        """
        with self.lock:
            if not self.active:
                raise CurationError(409, "Nothing to undo.")
            target = self.active[-1]
            event = self.log.append({"time": _now(), "action": "undo", "undoes": target["seq"]})
            changed = self._revert(target)
            if target["action"] == "synonym":
                self._write_synonyms()
            return {"event": event, "undone": target, "rows": self.rows(changed)}

    # --- the knowledge base, NIL clusters, saving ---------------------------------------------------------------
    def search(self, query: str, limit: int = 10) -> list[dict]:
        """Concepts for a text, best first: an exact concept id first, then the nearest names (every name)."""
        with self.lock:
            results = []
            exact = self.kb.resolve(query) if query.strip() else None
            if exact is not None:
                results.append({"concept_id": exact, "name": self.concept_name(exact), "matched": None, "score": 1.0})
            if self.kb.normalizer(query):
                (match,) = self.normalizer.searcher.search([query], strategy=SEARCH_STRATEGY, top_k=limit)
                for (cid, score), name in zip(match.candidates, match.names):
                    if cid != exact:
                        results.append({"concept_id": cid, "name": self.concept_name(cid),
                                        "matched": self.kb.surface(name), "score": round(float(score), 4)})  # fmt: skip
            return results[:limit]

    def nil_clusters(self, offset: int = 0, limit: int = 20) -> dict:
        """The mentions that stand NIL, grouped into clusters (candidate new concepts), the largest first."""
        with self.lock:
            nil = [i for i in range(len(self.mentions)) if _is_nil(self.final_concept(i))]
            if self._nil is None or self._nil[0] != tuple(nil):
                labels = group_nil([self.keys[i] for i in nil], self.nil_method, self._nil_encoder)
                self._nil = (tuple(nil), self._clusters(nil, labels))
            clusters = self._nil[1]
            return {"method": self.nil_method, "total": len(clusters), "mentions": len(nil), "offset": offset,
                    "clusters": clusters[offset : offset + limit]}  # fmt: skip

    def _clusters(self, nil: list[int], labels: list[int]) -> list[dict]:
        groups: dict[int, list[int]] = {}
        for i, label in zip(nil, labels):
            groups.setdefault(label, []).append(i)
        clusters = []
        for members in groups.values():
            texts = Counter(self.mentions[i].text for i in members)
            clusters.append({
                "name": texts.most_common(1)[0][0], "size": len(members),
                "documents": len({self.mentions[i].doc for i in members}),
                "texts": [{"text": t, "count": c} for t, c in texts.most_common(10)], "mentions": members[:20],
            })  # fmt: skip
        clusters.sort(key=lambda c: (-c["size"], c["name"]))
        return clusters

    def save_pipeline(self) -> str:
        """Write the pipeline, synonyms included, to `save_dir` (a temporary directory swapped in whole)."""
        with self.lock:
            if self.save_dir is None:
                raise CurationError(409, "No --save-model directory was given to the server.")
            save(self.nlp, self.save_dir)
            return str(self.save_dir)

    def info(self) -> dict:
        with self.lock:
            reviewed = sum(1 for d in self.decisions.values() if d)
            synonyms = sum(1 for e in self.active if e["action"] == "synonym")
            return {
                "documents": len(self.annotations.doc_ids), "mentions": len(self.mentions), "reviewed": reviewed,
                "synonyms": synonyms, "labels": self.labels, "statuses": list(STATUSES),
                "undo": self.active[-1]["action"] if self.active else None, "can_save": self.save_dir is not None,
                "reviews": str(self.log.path), "synonyms_file": str(self.synonyms_path or ""),
            }  # fmt: skip
