"""Serving a package: settings (the [serve] table), the Ray Serve application and its replica, metrics, the Ray
environment, the load test and the in-browser demo server. Ray is imported only when serving."""
