"""The admin's models of the library's tables (``reconcile/contrib/django/models.py``). All are
``managed = False``: this migration records them in Django's migration state and creates
nothing; the tables are the library's migrations' (``0001_library``)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reconcile', '0001_library'),
    ]

    operations = [
        migrations.CreateModel(
            name='CreditAnomaly',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('job_id', models.UUIDField(null=True)),
                ('user_id', models.UUIDField(null=True)),
                ('kind', models.TextField()),
                ('detail', models.JSONField(null=True)),
                ('created_at', models.DateTimeField()),
                ('resolved_at', models.DateTimeField(null=True)),
                ('resolved_by', models.TextField(null=True)),
                ('resolved_action', models.TextField(null=True)),
            ],
            options={
                'verbose_name_plural': 'credit anomalies',
                'db_table': 'reconcile_credit_anomalies',
                'ordering': ('-id',),
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='CreditBalance',
            fields=[
                ('user_id', models.UUIDField(primary_key=True, serialize=False)),
                ('sub', models.BigIntegerField()),
                ('topup', models.BigIntegerField()),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'reconcile_credit_balances',
                'ordering': ('-updated_at',),
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='CreditLot',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('user_id', models.UUIDField()),
                ('pool', models.TextField()),
                ('kind', models.TextField()),
                ('source_txn_id', models.TextField()),
                ('amount', models.BigIntegerField()),
                ('remaining_amount', models.BigIntegerField()),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'reconcile_credit_lots',
                'ordering': ('-id',),
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='CreditTransaction',
            fields=[
                ('id', models.TextField(primary_key=True, serialize=False)),
                ('user_id', models.UUIDField()),
                ('job_id', models.UUIDField(null=True)),
                ('type', models.TextField()),
                ('amount', models.BigIntegerField()),
                ('from_sub', models.BigIntegerField()),
                ('from_topup', models.BigIntegerField()),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'reconcile_credit_transactions',
                'ordering': ('-created_at', 'id'),
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.UUIDField(primary_key=True, serialize=False)),
                ('user_id', models.UUIDField()),
                ('job_type', models.TextField()),
                ('status', models.TextField()),
                ('error_message', models.TextField(null=True)),
                ('created_at', models.DateTimeField(null=True)),
                ('started_at', models.DateTimeField(null=True)),
                ('completed_at', models.DateTimeField(null=True)),
                ('provider_kind', models.TextField(null=True)),
                ('provider_model', models.TextField(null=True)),
                ('provider_task_id', models.TextField(null=True)),
                ('provider_call_started_at', models.DateTimeField(null=True)),
                ('submission_state', models.TextField(null=True)),
                ('claim_expires_at', models.DateTimeField(null=True)),
                ('reconcile_attempts', models.IntegerField(null=True)),
                ('reconcile_last_error', models.TextField(null=True)),
                ('reconcile_last_error_code', models.TextField(null=True)),
                ('reconcile_last_attempt_at', models.DateTimeField(null=True)),
                ('error_code', models.TextField(null=True)),
                ('error_detail', models.JSONField(null=True)),
                ('credits_actual', models.BigIntegerField(null=True)),
                ('next_poll_at', models.DateTimeField(null=True)),
                ('settle_attempts', models.IntegerField(null=True)),
            ],
            options={
                'db_table': 'jobs',
                'ordering': ('-created_at',),
                'permissions': [('act_on_jobs', 'Can act on jobs by hand (resolve, fail, retry a settlement)')],
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='JobEvent',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('event_id', models.TextField()),
                ('user_id', models.UUIDField()),
                ('type', models.TextField()),
                ('payload', models.JSONField(null=True)),
                ('created_at', models.DateTimeField()),
                ('published_at', models.DateTimeField(null=True)),
            ],
            options={
                'db_table': 'reconcile_job_events',
                'ordering': ('id',),
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='OperatorAction',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('created_at', models.DateTimeField()),
                ('operator', models.TextField()),
                ('via', models.TextField()),
                ('action', models.TextField()),
                ('job_id', models.UUIDField(null=True)),
                ('user_id', models.UUIDField(null=True)),
                ('reason', models.TextField()),
                ('detail', models.JSONField(null=True)),
            ],
            options={
                'verbose_name': 'operator action',
                'db_table': 'reconcile_operator_actions',
                'ordering': ('-id',),
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='InFlightJob',
            fields=[
            ],
            options={
                'verbose_name': 'job in flight',
                'verbose_name_plural': 'jobs in flight',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('reconcile.job',),
        ),
        migrations.CreateModel(
            name='PastHorizonJob',
            fields=[
            ],
            options={
                'verbose_name': 'job past its horizon',
                'verbose_name_plural': 'jobs past their horizon',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('reconcile.job',),
        ),
        migrations.CreateModel(
            name='StuckJob',
            fields=[
            ],
            options={
                'verbose_name': 'stuck job',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('reconcile.job',),
        ),
        migrations.CreateModel(
            name='UncertainJob',
            fields=[
            ],
            options={
                'verbose_name': 'uncertain submission',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('reconcile.job',),
        ),
        migrations.CreateModel(
            name='UnsettledJob',
            fields=[
            ],
            options={
                'verbose_name': 'unsettled refund',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('reconcile.job',),
        ),
    ]
