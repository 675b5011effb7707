"""Console URL routes; the pages and the API arrive with the console issue."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("console.api.urls")),
]
