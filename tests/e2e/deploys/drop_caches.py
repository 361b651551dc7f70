"""Operation fixture: the page-cache drop a lane start runs (the bed binds a plain file over drop_caches)."""

from sparkinfra.operations.lane import page_caches_dropped

page_caches_dropped(name="Page caches are dropped")
