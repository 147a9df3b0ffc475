"""The placement service (`moment serve`): the planner's answers over HTTP, and long jobs.

`app.create_app(settings)` builds the ASGI app: its state, and the routers of `routes` (one module per
area), whose dependencies (`deps`) read that state; handlers call the same library functions the CLI calls
(moment.planner.api, moment.placement.api, the topology readers), so both give the same answers.
Nothing here imports torch or is imported by the CLI before `moment serve` runs.
"""
