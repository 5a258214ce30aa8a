from django.contrib import admin
from django.urls import path
from platform_app import views

urlpatterns = [
    path("admin/", admin.site.urls),  # the library's tables, read-only (reconcile.contrib.django)
    path("api/v1/jobs", views.submit_job),
    path("api/v1/batches", views.submit_batch),
    path("api/v1/jobs/<uuid:job_id>", views.job),
    path("api/v1/jobs/<uuid:job_id>/cancel", views.cancel_job),
]
