"""The data the picker schedules on: the datastore of endpoints, the metrics scraper and its
parser, measured capacities, adapter placement, the prefix indexes and the KV-event
subscriber that feeds them, the text a request is routed on and its tokenizer (GIE's
``datalayer/``)."""
