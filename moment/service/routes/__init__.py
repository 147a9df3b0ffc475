"""The service's routes, one APIRouter per area, each at module level; `create_app` includes them under
/v1 (every one but health behind the token check) and fills the `app.state` they read through
`moment.service.deps`.

- health: is the service up (no token)
- machines: the built-in profiles and models, reading an uploaded machine description (scan)
- planning: plan, cluster plan, compare, simulate, and the page's compare over any machines and advice
- jobs: place and probe jobs, their state, cancelling them
- page: what the planning page needs beyond those (a machine's what-if targets)
- fallback: JSON for any other /v1 request
"""
