"""The composition root: builds the sidecar's object graph (:mod:`.graph`), runs it
(:mod:`.sidecar`) and tunes the process for serving (:mod:`.process`). It imports the API,
never the other way round."""
