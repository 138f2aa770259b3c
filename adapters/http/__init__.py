"""HTTP listeners on a production server: uvicorn (h11) serving Starlette apps, with
deadlines and limits that slow or idle clients cannot get round (``server``)."""
