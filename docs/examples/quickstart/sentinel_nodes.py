from celery import Celery

app = Celery("proj")
app.conf.redlock_nodes = [
    "sentinel://s1:26379;sentinel://s2:26379;sentinel://s3:26379/0?master_name=locks1",
    "sentinel://s1:26379;sentinel://s2:26379;sentinel://s3:26379/0?master_name=locks2",
    "sentinel://s1:26379;sentinel://s2:26379;sentinel://s3:26379/0?master_name=locks3",
]
