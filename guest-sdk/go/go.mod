module baton/sdk

go 1.24
