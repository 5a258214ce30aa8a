from django.urls import path
from platform_app import views

urlpatterns = [
    path("api/v1/jobs", views.submit_job),
    path("api/v1/jobs/<uuid:job_id>", views.job),
    path("api/v1/jobs/<uuid:job_id>/cancel", views.cancel_job),
]
