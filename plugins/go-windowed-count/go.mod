module go-windowed-count

go 1.24

require baton/sdk v0.0.0

replace baton/sdk => ../../guest-sdk/go
