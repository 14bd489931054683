module github.com/logfwd/forwarder

go 1.26

require (
	github.com/klauspost/compress v1.20.4
	go.etcd.io/bbolt v1.4.3
	go.uber.org/goleak v1.3.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/kr/text v0.2.0 // indirect
	golang.org/x/sys v0.29.0 // indirect
)
