"""What the node reports about its models (bootstrap/modelcache/report.py): written only when it changed, a failed
write tried again."""

from __future__ import annotations

from nodewarm.api import models
from nodewarm.api.names import MODELS_ANNOTATION
from nodewarm.bootstrap.modelcache.report import Book


def test_the_report_is_written_only_when_it_changed():
    sent = []
    book = Book(sent.append)
    book.put(models.HeldModel("multi-embed", models.WARM, "g1", key="k1"))
    assert book.publish() and not book.publish()
    book.put(models.HeldModel("multi-embed", models.EVICTING, "g1", key="k1"))
    assert book.publish()
    assert [models.decode(s[MODELS_ANNOTATION])["multi-embed"].state for s in sent] == ["warm", "evicting"]
    book._write = lambda ann: (_ for _ in ()).throw(OSError("API down"))
    book.put(models.HeldModel("multi-embed", models.WARM, "g1", key="k1"))
    assert not book.publish()                 # failed: tried again at the next publish
    book._write = sent.append
    assert book.publish()
