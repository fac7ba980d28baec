"""Create (or upgrade) awa_pool's schema with Django's own migrations, in
the same transaction: `python manage.py migrate` sets up the job queue too."""
from django.db import migrations

import awa_pool


def apply_awa_pool_migrations(apps, schema_editor) -> None:
    awa_pool.migrate(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [("shop", "0001_initial")]

    operations = [
        migrations.RunPython(apply_awa_pool_migrations, migrations.RunPython.noop),
    ]
